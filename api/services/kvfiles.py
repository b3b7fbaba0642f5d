"""KV file mirror and operations. The gpu_worker owns KV files; the control plane mirrors its
``kv_list`` per tenant so the console can list them, and forwards delete/pin/evict to the worker
over the admin socket (evictions by staff are audited). How many files a tenant has is bounded by
its plan (``max_kv_files``, enforced by the worker), and the mirror is refreshed with a few bulk
statements whatever that count: one ``update_or_create`` per file took 17 s for 5,000 files."""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from api.models import AuditLog, KVFile, Tenant
from api.services.quotas import QuotaExceeded, kv_quota, plan_limits
from gpu_worker import protocol

log = logging.getLogger(__name__)


class WorkerUnavailable(Exception):
    """The gpu_worker admin socket could not be reached or refused the request."""


def _client():
    from gpu_worker.admin_client import AdminClient

    return AdminClient(settings.SYMPHONY_WORKER_ADMIN_SOCKET, timeout=10)


def _call(args: protocol.Args) -> Any:
    """Run one admin op, given as its typed arguments (``gpu_worker.protocol.ADMIN_OPS``)."""
    op = args.OP
    try:
        return _client().run(args)
    except protocol.ProtocolError as exc:
        if exc.code == protocol.ErrorCode.QUOTA:  # the tenant's plan share: its request, not the worker
            raise QuotaExceeded(exc.message) from exc
        log.warning("worker_call_failed op=%s error=%s", op, exc)
        raise WorkerUnavailable(f"gpu_worker {op} failed: {exc}") from exc
    except Exception as exc:
        log.warning("worker_call_failed op=%s error=%s", op, exc)
        raise WorkerUnavailable(f"gpu_worker {op} failed: {type(exc).__name__}: {exc}") from exc


#: The mirrored fields of a ``kv_list`` row.
MIRRORED = ("tokens", "bytes", "residency", "pinned", "last_used")


def _mirrored(entry: dict) -> tuple:
    return (
        entry.get("tokens", 0),
        entry.get("bytes", 0),
        entry.get("residency", ""),
        bool(entry.get("pinned", False)),
        entry.get("last_used"),
    )


@transaction.atomic
def sync(tenant: Tenant) -> None:
    """Replace the tenant's mirror rows for this worker with the worker's current kv_list: new
    and changed rows in one upsert, vanished ones in one delete, ``synced_at`` in one update."""
    worker = settings.SYMPHONY_WORKER_NAME
    entries = {
        e["name"]: _mirrored(e) for e in _call(protocol.KvList(tenant=tenant.slug)) if e.get("tenant") == tenant.slug
    }
    rows = KVFile.objects.filter(tenant=tenant, worker=worker)
    have = {row[0]: (row[1], tuple(row[2:])) for row in rows.values_list("name", "pk", *MIRRORED)}
    changed = [
        KVFile(tenant=tenant, worker=worker, name=name, **dict(zip(MIRRORED, values, strict=True)))
        for name, values in entries.items()
        if name not in have or have[name][1] != values
    ]
    KVFile.objects.bulk_create(
        changed,
        batch_size=1000,
        update_conflicts=True,
        unique_fields=["tenant", "worker", "name"],
        update_fields=[*MIRRORED, "synced_at"],
    )
    gone = [pk for name, (pk, _) in have.items() if name not in entries]
    if gone:
        KVFile.objects.filter(pk__in=gone).delete()
    rows.update(synced_at=timezone.now())  # every row was confirmed now, changed or not


def delete(kv: KVFile) -> None:
    _call(protocol.KvDelete(tenant=kv.tenant.slug, name=kv.name))
    kv.delete()


def delete_all(tenant: Tenant) -> int:
    """Delete every KV file of ``tenant`` from this host's worker (device, host memory) and from
    the KV store (all of the tenant's objects there, which a shared store may hold for workers
    that are gone), and their mirror rows here; returns how many files went."""
    deleted = protocol.TenantDeleted.from_wire(_call(protocol.KvDeleteTenant(tenant=tenant.slug))).deleted
    KVFile.objects.filter(tenant=tenant, worker=settings.SYMPHONY_WORKER_NAME).delete()
    return len(deleted)


def pin(kv: KVFile, pinned: bool) -> KVFile:
    """Pin or unpin on the worker, which checks the pin against the tenant's plan share
    (sent along: the worker may not have run anything of this tenant yet); past it
    :class:`QuotaExceeded`."""
    _call(
        protocol.AdminKvPin(tenant=kv.tenant.slug, name=kv.name, pinned=pinned, quota=kv_quota(plan_limits(kv.tenant)))
    )
    kv.pinned = pinned
    kv.save(update_fields=["pinned", "synced_at"])
    return kv


def staff_evict(kv: KVFile, actor) -> None:
    """Evict a file from device/host memory on behalf of an operator; leaves an AuditLog row."""
    _call(protocol.KvEvict(tenant=kv.tenant.slug, name=kv.name))
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
