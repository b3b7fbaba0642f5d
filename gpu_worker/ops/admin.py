"""Handlers of the control-plane ops on the admin socket (never mounted into a sandbox)."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Protocol

from gpu_worker import protocol as p
from gpu_worker.ops.context import OpContext
from gpu_worker.ops.registry import admin_op
from gpu_worker.protocol import ErrorCode, ProtocolError
from gpu_worker.sessions import QUOTA_KEYS, WorkerSession, parse_tenant_quota

log = logging.getLogger(__name__)


class AdminContext(Protocol):
    """What the control plane's ops may use of the worker: its health and metrics, the session
    lifecycle, and KVFS through the op context (``server.Worker`` is the one implementation)."""

    context: OpContext

    def health(self) -> dict[str, Any]: ...

    def stats(self) -> dict[str, Any]: ...

    async def create_session(
        self,
        tenant: str,
        run_id: str,
        limits: object,
        tree: str | None = None,
        trace: p.TraceContext | None = None,
    ) -> WorkerSession: ...

    def engine_timeline(self, limit: int | None = None) -> p.EngineTimelineReply: ...

    async def end_session(self, session_id: str) -> p.SessionEnded: ...


@admin_op(p.Health)
async def health(w: AdminContext, args: p.Health) -> dict[str, Any]:
    return w.health()


@admin_op(p.Stats)
async def stats(w: AdminContext, args: p.Stats) -> dict[str, Any]:
    return w.stats()


@admin_op(p.CreateSession)
async def create_session(w: AdminContext, args: p.CreateSession) -> p.SessionCreated:
    s = await w.create_session(args.tenant, args.run_id, args.limits, args.tree, args.trace)
    return p.SessionCreated(session_id=s.session_id, socket_path=s.socket_path, token=s.token)


@admin_op(p.EndSession)
async def end_session(w: AdminContext, args: p.EndSession) -> p.SessionEnded:
    return await w.end_session(args.session_id)


@admin_op(p.EngineTimeline)
async def engine_timeline(w: AdminContext, args: p.EngineTimeline) -> p.EngineTimelineReply:
    """The engine's last forwards, for staff (gpu_worker/engine_timeline.py)."""
    return w.engine_timeline(args.limit)


@admin_op(p.KvList)
async def kv_list(w: AdminContext, args: p.KvList) -> list[dict[str, Any]]:
    rows = await w.context.kv(w.context.kvfs.list_files, args.tenant)
    return [dataclasses.asdict(r) for r in rows]


@admin_op(p.KvEvict)
async def kv_evict(w: AdminContext, args: p.KvEvict) -> None:
    await w.context.kv(w.context.kvfs.evict, args.tenant, args.name)
    log.info("event=kv_evict tenant=%s name=%s by=admin", args.tenant, args.name)


@admin_op(p.KvDelete)
async def kv_delete(w: AdminContext, args: p.KvDelete) -> None:
    await w.context.kv(w.context.kvfs.remove, args.tenant, args.name)
    log.info("event=kv_delete tenant=%s name=%s by=admin", args.tenant, args.name)


@admin_op(p.KvDeleteTenant)
async def kv_delete_tenant(w: AdminContext, args: p.KvDeleteTenant) -> p.TenantDeleted:
    """Everything of a closed tenant (api/services/tenant_closure.py), the shared store included."""
    names = await w.context.kv(w.context.kvfs.remove_tenant, args.tenant)
    log.info("event=kv_delete_tenant tenant=%s files=%d by=admin", args.tenant, len(names))
    return p.TenantDeleted(deleted=names)


@admin_op(p.AdminKvPin)
async def kv_pin(w: AdminContext, args: p.AdminKvPin) -> None:
    """Pin or unpin a tenant's named file (the REST API's pin), under the tenant's plan bounds
    given as ``quota``, set first so a tenant with no run on this worker yet is held to its plan."""
    quota = args.quota
    if quota is not None:
        if not isinstance(quota, dict) or not set(quota) <= set(QUOTA_KEYS):
            raise ProtocolError(ErrorCode.BAD_ARGS, f"quota must be a map with keys among {', '.join(QUOTA_KEYS)}")
        await w.context.kv(w.context.kvfs.set_tenant_quota, args.tenant, parse_tenant_quota(quota))
    await w.context.kv(w.context.kvfs.pin, args.tenant, args.name, args.pinned)
