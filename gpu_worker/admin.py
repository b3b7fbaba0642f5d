"""Handlers of the control-plane ops on the admin socket (never mounted into a sandbox)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from gpu_worker.protocol import MAX_NAME_CHARS, ErrorCode, ProtocolError
from gpu_worker.validate import get_bool, get_str

if TYPE_CHECKING:
    from gpu_worker.server import Worker

log = logging.getLogger(__name__)

Handler = Callable[["Worker", dict[str, Any]], Awaitable[Any]]
HANDLERS: dict[str, Handler] = {}


def op(name: str) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        HANDLERS[name] = fn
        return fn

    return register


def _tenant(args: dict[str, Any]) -> str:
    tenant = get_str(args, "tenant", 64)
    if not tenant:
        raise ProtocolError(ErrorCode.BAD_ARGS, "tenant must not be empty")
    return tenant


@op("health")
async def health(w: Worker, args: dict[str, Any]) -> Any:
    return w.health()


@op("stats")
async def stats(w: Worker, args: dict[str, Any]) -> Any:
    return w.stats()


@op("create_session")
async def create_session(w: Worker, args: dict[str, Any]) -> Any:
    run_id = get_str(args, "run_id", 200)
    s = await w.create_session(_tenant(args), run_id, args.get("limits"))
    return {"session_id": s.session_id, "socket_path": s.socket_path, "token": s.token}


@op("end_session")
async def end_session(w: Worker, args: dict[str, Any]) -> Any:
    return await w.end_session(get_str(args, "session_id", 100))


@op("kv_list")
async def kv_list(w: Worker, args: dict[str, Any]) -> Any:
    tenant = args.get("tenant")
    if tenant is not None:
        tenant = _tenant(args)
    rows = await w.kv(w.kvfs.list_files, tenant)
    return [dataclasses.asdict(r) for r in rows]


@op("kv_evict")
async def kv_evict(w: Worker, args: dict[str, Any]) -> Any:
    tenant, name = _tenant(args), get_str(args, "name", MAX_NAME_CHARS)
    await w.kv(w.kvfs.evict, tenant, name)
    log.info("event=kv_evict tenant=%s name=%s by=admin", tenant, name)


@op("kv_delete")
async def kv_delete(w: Worker, args: dict[str, Any]) -> Any:
    tenant, name = _tenant(args), get_str(args, "name", MAX_NAME_CHARS)
    await w.kv(w.kvfs.remove, tenant, name)
    log.info("event=kv_delete tenant=%s name=%s by=admin", tenant, name)


@op("kv_delete_tenant")
async def kv_delete_tenant(w: Worker, args: dict[str, Any]) -> Any:
    """Everything of a closed tenant (api/services/tenant_closure.py), the shared store included."""
    tenant = _tenant(args)
    names = await w.kv(w.kvfs.remove_tenant, tenant)
    log.info("event=kv_delete_tenant tenant=%s files=%d by=admin", tenant, len(names))
    return {"deleted": names}


@op("kv_pin")
async def kv_pin(w: Worker, args: dict[str, Any]) -> Any:
    await w.kv(w.kvfs.pin, _tenant(args), get_str(args, "name", MAX_NAME_CHARS), get_bool(args, "pinned", True))
