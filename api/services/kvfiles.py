"""KV file mirror and operations. The gpu_worker owns KV files; the control plane mirrors its
``kv_list`` per tenant so the console can list them, and forwards delete/pin/evict to the worker
over the admin socket (evictions by staff are audited)."""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import transaction

from api.models import AuditLog, KVFile, Tenant

log = logging.getLogger(__name__)


class WorkerUnavailable(Exception):
    """The gpu_worker admin socket could not be reached or refused the request."""


def _client():
    from gpu_worker.admin_client import AdminClient

    return AdminClient(settings.SYMPHONY_WORKER_ADMIN_SOCKET, timeout=10)


def _call(op: str, *args):
    try:
        return getattr(_client(), op)(*args)
    except Exception as exc:
        log.warning("worker_call_failed op=%s error=%s", op, exc)
        raise WorkerUnavailable(f"gpu_worker {op} failed: {type(exc).__name__}: {exc}") from exc


@transaction.atomic
def sync(tenant: Tenant) -> None:
    """Replace the tenant's mirror rows for this worker with the worker's current kv_list."""
    worker = settings.SYMPHONY_WORKER_NAME
    entries = [e for e in _call("kv_list", tenant.slug) if e.get("tenant") == tenant.slug]
    names = set()
    for entry in entries:
        names.add(entry["name"])
        KVFile.objects.update_or_create(
            tenant=tenant,
            worker=worker,
            name=entry["name"],
            defaults={
                "tokens": entry.get("tokens", 0),
                "bytes": entry.get("bytes", 0),
                "residency": entry.get("residency", ""),
                "pinned": bool(entry.get("pinned", False)),
                "last_used": entry.get("last_used"),
            },
        )
    KVFile.objects.filter(tenant=tenant, worker=worker).exclude(name__in=names).delete()


def delete(kv: KVFile) -> None:
    _call("kv_delete", kv.tenant.slug, kv.name)
    kv.delete()


def delete_all(tenant: Tenant) -> int:
    """Delete every KV file of ``tenant`` from this host's worker (device, host memory) and from
    the KV store (all of the tenant's objects there, which a shared store may hold for workers
    that are gone), and their mirror rows here; returns how many files went."""
    deleted = _call("kv_delete_tenant", tenant.slug)
    KVFile.objects.filter(tenant=tenant, worker=settings.SYMPHONY_WORKER_NAME).delete()
    return len(deleted)


def pin(kv: KVFile, pinned: bool) -> KVFile:
    _call("kv_pin", kv.tenant.slug, kv.name, pinned)
    kv.pinned = pinned
    kv.save(update_fields=["pinned", "synced_at"])
    return kv


def staff_evict(kv: KVFile, actor) -> None:
    """Evict a file from device/host memory on behalf of an operator; leaves an AuditLog row."""
    _call("kv_evict", kv.tenant.slug, kv.name)
    residency_before = kv.residency
    kv.residency = "disk"  # what kv_evict does; the next sync confirms it
    kv.save(update_fields=["residency", "synced_at"])
    AuditLog.objects.create(
        actor=actor,
        tenant=kv.tenant,
        action="kv_evict",
        target=kv.name,
        detail={"worker": kv.worker, "residency_before": residency_before},
    )
    log.info("kv_evicted tenant=%s name=%s by=%s", kv.tenant.slug, kv.name, getattr(actor, "pk", None))
