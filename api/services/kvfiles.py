"""KV file mirror and operations. The gpu_workers own KV files; the control plane mirrors each
worker's ``kv_list`` per tenant (one row per worker and name) so the console can list them, and
forwards delete/pin/evict to the worker that holds the file (evictions by staff are audited).
How many files a tenant has is bounded by its plan (``max_kv_files``, enforced by the worker),
and the mirror is refreshed with a few bulk statements whatever that count: one
``update_or_create`` per file took 17 s for 5,000 files.

With several workers, an operation on a file goes to the worker its row names: over this
process's admin socket when that is this host's worker (``SYMPHONY_WORKER_NAME``), else as the
``api.kv_admin`` task on ``worker.<name>``, executed by that worker's own executor against its
own admin socket, and waited for (``KV_ADMIN_TIMEOUT_S``; the task expires unexecuted after
it, so an operation reported as failed does not happen later). A worker with no live executor
is refused at once (:class:`WorkerUnavailable`, a 503): nothing reports success for an operation
that did not happen. A file several workers hold (read from the shared store) is deleted from
each of them; a row of a worker that is gone (no heartbeat: removed, or dead past its lease) is
deleted through any live worker, whose delete removes the store's object, and a worker's
"no such file" counts as gone.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from api.models import AuditLog, KVFile, Tenant
from api.services.quotas import PlanQuotaExceeded, kv_quota, plan_limits
from gpu_worker import protocol

log = logging.getLogger(__name__)


class WorkerUnavailable(Exception):
    """The gpu_worker admin socket could not be reached or refused the request."""


class FileGone(WorkerUnavailable):
    """The worker answered that it has no such file."""


#: Seconds a KV operation on another worker is waited for (and after which its task expires).
KV_ADMIN_TIMEOUT_S = 15.0
#: The same for a listing: a worker whose executor slots are all busy is served from its last
#: mirror (``X-Symphony-Stale``) rather than hold the request up.
KV_LIST_TIMEOUT_S = 3.0
#: The admin operations the ``api.kv_admin`` task runs: the KV ones, and the staff's read of a
#: worker's engine timeline (api/services/engine_timeline.py), which travels the same way.
KV_ADMIN_OPS = frozenset(
    op.OP
    for op in (
        protocol.KvList,
        protocol.KvDelete,
        protocol.AdminKvPin,
        protocol.KvEvict,
        protocol.KvDeleteTenant,
        protocol.EngineTimeline,
    )
)


def _client():
    from gpu_worker.admin_client import AdminClient

    return AdminClient(settings.SYMPHONY_WORKER_ADMIN_SOCKET, timeout=10)


def run_locally(op: str, wire: dict[str, Any]) -> dict[str, Any]:
    """The admin op ``op`` (its arguments as sent on the wire) on this host's worker, as a
    JSON-able answer: ``{"result": ...}`` or ``{"error": code, "message": ...}``. What the
    ``api.kv_admin`` task runs."""
    if op not in KV_ADMIN_OPS:
        return {"error": "EINVAL", "message": f"not a KV admin operation: {op!r}"}
    try:
        args = protocol.ADMIN_OPS[op].decode(wire)
        return {"result": _client().run(args)}
    except protocol.ProtocolError as exc:
        return {"error": exc.code, "message": exc.message}
    except Exception as exc:
        return {"error": "EUNREACHABLE", "message": f"{type(exc).__name__}: {exc}"}


def _on_worker(worker: str, args: protocol.Args, timeout: float) -> dict[str, Any]:
    """``args`` run by ``worker``'s own executor (the ``api.kv_admin`` task on its queue)."""
    import redis
    from celery.exceptions import TimeoutError as CeleryTimeout

    from api.services import routing

    try:
        if not routing.has_executor(worker):
            return {"error": "EUNREACHABLE", "message": f"no live executor serves gpu_worker {worker!r}"}
    except redis.RedisError as exc:
        return {"error": "EUNREACHABLE", "message": f"worker liveness unreadable: {exc}"}
    from api import dispatch

    pending = dispatch.task(dispatch.KV_ADMIN).apply_async(
        args=[args.OP, args.to_wire()], queue=f"worker.{worker}", expires=timeout
    )
    try:
        return pending.get(timeout=timeout, disable_sync_subtasks=False)
    except CeleryTimeout:
        pending.revoke()
        return {"error": "EUNREACHABLE", "message": f"gpu_worker {worker!r} did not answer in {timeout:g}s"}
    except Exception as exc:  # the task failed or its result could not be read
        return {"error": "EUNREACHABLE", "message": f"{type(exc).__name__}: {exc}"}


def call_worker(args: protocol.Args, worker: str | None = None) -> Any:
    """One admin op, given as its typed arguments (``gpu_worker.protocol.ADMIN_OPS``), on
    ``worker`` (default: this host's); raises :class:`PlanQuotaExceeded` for the tenant's plan
    share, :class:`FileGone` for no such file, else :class:`WorkerUnavailable`."""
    op = args.OP
    target = worker or settings.SYMPHONY_WORKER_NAME
    if target == settings.SYMPHONY_WORKER_NAME:
        answer = run_locally(op, args.to_wire())
    else:
        timeout = KV_LIST_TIMEOUT_S if op == protocol.KvList.OP else KV_ADMIN_TIMEOUT_S
        answer = _on_worker(target, args, timeout)
    if "error" not in answer:
        return answer["result"]
    code, message = answer["error"], answer.get("message", "")
    if code == protocol.ErrorCode.QUOTA:  # the tenant's plan share: its request, not the worker
        raise PlanQuotaExceeded(message)
    log.warning("worker_call_failed op=%s worker=%s code=%s error=%s", op, target, code, message)
    if code == protocol.ErrorCode.NOT_FOUND:
        raise FileGone(f"gpu_worker {target!r} has no such file: {message}")
    raise WorkerUnavailable(f"gpu_worker {target!r} {op} failed: {message}")


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


def holders() -> list[str]:
    """The workers whose files are listed: this host's and every worker an executor serves."""
    import redis

    from api.services import routing

    names = {settings.SYMPHONY_WORKER_NAME}
    try:
        names |= {c.worker.name for c in routing.candidates()}
    except redis.RedisError:
        pass
    return sorted(names)


def sync(tenant: Tenant) -> list[str]:
    """Refresh the tenant's mirror from every worker that can be asked (:func:`holders`);
    rows of workers that are gone for good stay until deleted. Returns the workers that could
    not be asked; :class:`WorkerUnavailable` when none could."""
    failed = []
    asked = holders()
    for worker in asked:
        try:
            sync_worker(tenant, worker)
        except WorkerUnavailable:
            failed.append(worker)
    if failed and len(failed) == len(asked):
        raise WorkerUnavailable(f"no gpu_worker could list the files ({', '.join(failed)})")
    return failed


@transaction.atomic
def sync_worker(tenant: Tenant, worker: str) -> None:
    """Replace the tenant's mirror rows for ``worker`` with its current kv_list: new and changed
    rows in one upsert, vanished ones in one delete, ``synced_at`` in one update."""
    listed = call_worker(protocol.KvList(tenant=tenant.slug), worker=worker)
    entries = {e["name"]: _mirrored(e) for e in listed if e.get("tenant") == tenant.slug}
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
    delete_named(kv.tenant, kv.name)


def delete_named(tenant: Tenant, name: str) -> None:
    """Delete the tenant's file ``name`` from every worker holding it (the shared store's object
    with it), then its rows. A row of a worker that is gone, or a file no row names, is deleted
    through this host's worker; a worker without the file counts as done; any other failure
    raises before a row is removed, so a file a worker still holds is never reported deleted."""
    from api.services import routing

    rows = list(KVFile.objects.filter(tenant=tenant, name=name))
    live = {w.name for w in routing.live_workers()}
    targets = {row.worker if row.worker in live else settings.SYMPHONY_WORKER_NAME for row in rows}
    for worker in sorted(targets or {settings.SYMPHONY_WORKER_NAME}):
        try:
            call_worker(protocol.KvDelete(tenant=tenant.slug, name=name), worker=worker)
        except FileGone:
            pass
    KVFile.objects.filter(pk__in=[row.pk for row in rows]).delete()


def delete_all(tenant: Tenant) -> int:
    """Delete every KV file of ``tenant`` from this host's worker (device, host memory) and from
    the KV store (all of the tenant's objects there, which a shared store may hold for workers
    that are gone), and their mirror rows here; returns how many files went."""
    deleted = protocol.TenantDeleted.from_wire(call_worker(protocol.KvDeleteTenant(tenant=tenant.slug))).deleted
    KVFile.objects.filter(tenant=tenant, worker=settings.SYMPHONY_WORKER_NAME).delete()
    return len(deleted)


def pin(kv: KVFile, pinned: bool) -> KVFile:
    """Pin or unpin on the worker, which checks the pin against the tenant's plan share
    (sent along: the worker may not have run anything of this tenant yet); past it
    :class:`PlanQuotaExceeded`."""
    call_worker(
        protocol.AdminKvPin(tenant=kv.tenant.slug, name=kv.name, pinned=pinned, quota=kv_quota(plan_limits(kv.tenant))),
        worker=kv.worker,
    )
    kv.pinned = pinned
    kv.save(update_fields=["pinned", "synced_at"])
    return kv


def staff_evict(kv: KVFile, actor) -> None:
    """Evict a file from device/host memory on behalf of an operator; leaves an AuditLog row."""
    call_worker(protocol.KvEvict(tenant=kv.tenant.slug, name=kv.name), worker=kv.worker)
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
