"""A LIP's child runs: ``spawn``, ``child_wait``, ``child_cancel`` (``symphony.spawn``).

A child is a run of the control plane, which the worker does not import: ``spawn`` and
``child_cancel`` are relayed to the parent run's executor through Redis
(``contracts.ProcRequest`` / ``ProcReply``, served by ``api/services/procs.py``), which creates,
starts and cancels child runs with the plan's checks. ``child_wait`` is served here: it reads the
child's event stream (``run:<child>``) until its ``end`` event, which the control plane writes
whenever a run ends, however it ends. A session may wait on and cancel only the children it
spawned itself (their ids are kept on the session); any other id is EPERM.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import uuid
from collections.abc import Iterable
from typing import Any

from gpu_worker import contracts
from gpu_worker import protocol as p
from gpu_worker.ops.context import OpContext
from gpu_worker.ops.registry import lip_op
from gpu_worker.protocol import ErrorCode, ProtocolError
from gpu_worker.sessions import WorkerSession

log = logging.getLogger(__name__)

#: Longest single XREAD block of ``child_wait`` (it loops; shorter blocks notice a session's end).
WAIT_BLOCK_S = 5.0
#: Status events looked back at for a finished child's error text.
ERROR_LOOKBACK = 16


def _bad(message: str) -> ProtocolError:
    return ProtocolError(ErrorCode.BAD_ARGS, message)


def _relay_down(exc: BaseException) -> ProtocolError:
    log.warning("event=proc_relay_failed error=%r", exc)
    return ProtocolError(ErrorCode.IO, f"the control plane could not be reached ({type(exc).__name__})")


async def _relay(ctx: OpContext, s: WorkerSession, request: contracts.ProcRequest) -> contracts.ProcReply:
    """Push ``request`` to the parent's executor and wait for its reply (at most
    ``PROC_REPLY_TIMEOUT_S``, and never past the run's deadline)."""
    wait = contracts.PROC_REPLY_TIMEOUT_S
    left = s.time_left()
    if left is not None:
        wait = min(wait, left)
    if wait <= 0:
        raise s.deadline_error()
    client = ctx.redis()
    reply_key = contracts.proc_reply_key(request.id)
    try:
        pipe = client.pipeline(transaction=True)
        pipe.rpush(contracts.proc_requests_key(s.run_id), request.encode())
        pipe.expire(contracts.proc_requests_key(s.run_id), contracts.PROC_KEY_TTL_S)
        await pipe.execute()
        got = await asyncio.wait_for(client.blpop([reply_key], timeout=max(1, math.ceil(wait))), wait + 5)
    except TimeoutError:
        got = None
    except Exception as exc:  # redis raises many types; none may reach a LIP as INTERNAL
        raise _relay_down(exc) from None
    if got is None:
        raise ProtocolError(
            ErrorCode.TIMEOUT, f"the run's executor did not answer {request.op} within {wait:.0f}s (it may have ended)"
        )
    try:
        reply = contracts.ProcReply.decode(got[1])
    except ValueError as exc:
        raise ProtocolError(ErrorCode.INTERNAL, f"{request.op}: unreadable reply from the executor ({exc})") from None
    if not reply.ok:
        code = reply.code if reply.code in vars(ErrorCode).values() else ErrorCode.INTERNAL
        raise ProtocolError(code, reply.message or f"{request.op} refused")
    return reply


def _own_child(s: WorkerSession, child: str) -> str:
    if child not in s.children:
        raise ProtocolError(ErrorCode.PERMISSION, f"run {child!r} is not a child this run spawned")
    return child


@lip_op(p.Spawn)
async def spawn(ctx: OpContext, s: WorkerSession, args: p.Spawn) -> p.Spawned:
    if not s.limits.spawn:
        raise ProtocolError(
            ErrorCode.PERMISSION, "this session cannot spawn: only runs started by the control plane have an executor"
        )
    s.check_deadline()
    try:
        size = len(json.dumps(args.args, allow_nan=False, separators=(",", ":")).encode())
    except (TypeError, ValueError) as exc:
        raise _bad(f"spawn args must be JSON data: {exc}") from None
    if size > p.MAX_SPAWN_ARGS_BYTES:
        raise _bad(f"spawn args of {size} bytes (as JSON) are over the {p.MAX_SPAWN_ARGS_BYTES} a run may take")
    if args.limits is not None and not isinstance(args.limits, dict):
        raise _bad("spawn limits must be a map of run limits")
    request = contracts.ProcRequest(
        id=uuid.uuid4().hex, op="spawn", parent=s.run_id, entry=args.entry, args=args.args, limits=args.limits
    )
    s.spawning += 1
    try:
        reply = await ctx.blocked_on_io(s, _relay(ctx, s, request))
        s.children.add(reply.child)
    finally:
        s.spawning -= 1
    log.info("event=spawn session=%s tenant=%s run=%s child=%s", s.session_id, s.tenant, s.run_id, reply.child)
    return p.Spawned(child=reply.child)


@lip_op(p.ChildCancel)
async def child_cancel(ctx: OpContext, s: WorkerSession, args: p.ChildCancel) -> bool:
    child = _own_child(s, args.child)
    request = contracts.ProcRequest(id=uuid.uuid4().hex, op="cancel", parent=s.run_id, child=child)
    reply = await ctx.blocked_on_io(s, _relay(ctx, s, request))
    return reply.cancelled


@lip_op(p.ChildWait)
async def child_wait(ctx: OpContext, s: WorkerSession, args: p.ChildWait) -> p.ChildStatus:
    child = _own_child(s, args.child)
    s.check_deadline()
    left = s.time_left()
    wait = math.inf if args.timeout is None else float(args.timeout)
    by_deadline = left is not None and left < wait
    if left is not None:
        wait = min(wait, left)
    try:
        status = await ctx.blocked_on_io(s, _await_end(ctx.redis(), child, wait))
    except ProtocolError:
        raise
    except Exception as exc:
        raise _relay_down(exc) from None
    if status is None:
        if by_deadline:
            raise ProtocolError(
                ErrorCode.TIMEOUT, f"run deadline of {s.limits.deadline_s}s passed while waiting for child {child}"
            )
        return p.ChildStatus(child=child, status="running")
    status_, result, error = status
    return p.ChildStatus(child=child, status=status_, result=result, error=error)


async def _await_end(client: Any, child: str, wait: float) -> tuple[str, Any, str] | None:
    """``(status, result, error)`` once the child's stream has its ``end`` event; None when
    ``wait`` seconds passed first."""
    key = contracts.run_stream_key(child)
    loop = asyncio.get_running_loop()
    until = loop.time() + wait
    last = await client.xrevrange(key, count=1)
    start = "0-0"
    if last:
        entry_id, fields = last[0]
        if contracts.entry_strings(fields)[0] == contracts.END:
            return await _final(client, key, fields)
        start = entry_id
    while True:
        remaining = until - loop.time()
        if remaining <= 0:
            return None
        block_ms = max(1, int(min(remaining, WAIT_BLOCK_S) * 1000))
        got = await client.xread({key: start}, count=200, block=block_ms)
        for _stream, entries in got or []:
            for entry_id, fields in entries:
                start = entry_id
                if contracts.entry_strings(fields)[0] == contracts.END:
                    return await _final(client, key, fields)


async def await_all_ended(client: Any, children: Iterable[str]) -> dict[str, tuple[str, str]]:
    """``{child: (status, error)}`` once every one of ``children`` has its ``end`` event,
    however long that takes (the caller bounds it: a channel read that stops waiting cancels
    it). Redis errors propagate."""
    ended: dict[str, tuple[str, str]] = {}
    starts: dict[str, str] = {}
    for child in children:
        key = contracts.run_stream_key(child)
        last = await client.xrevrange(key, count=1)
        if last and contracts.entry_strings(last[0][1])[0] == contracts.END:
            status, _result, error = await _final(client, key, last[0][1])
            ended[child] = (status, error)
        else:
            starts[key] = last[0][0] if last else "0-0"
    by_key = {contracts.run_stream_key(c): c for c in children}
    while starts:
        got = await client.xread(starts, count=200, block=int(WAIT_BLOCK_S * 1000))
        for stream, entries in got or []:
            key = stream.decode() if isinstance(stream, bytes) else str(stream)
            for entry_id, fields in entries:
                if key not in starts:
                    break
                starts[key] = entry_id
                if contracts.entry_strings(fields)[0] == contracts.END:
                    status, _result, error = await _final(client, key, fields)
                    ended[by_key[key]] = (status, error)
                    del starts[key]
    return ended


async def _final(client: Any, key: str, end_fields: Any) -> tuple[str, Any, str]:
    """The end event's status and result, with the error of the status event before it."""
    end = contracts.decode(*contracts.entry_strings(end_fields))
    assert isinstance(end, contracts.EndEvent)
    error = ""
    for _entry_id, fields in await client.xrevrange(key, count=ERROR_LOOKBACK):
        type_, data = contracts.entry_strings(fields)
        if type_ == contracts.StatusEvent.TYPE:
            event = contracts.decode(type_, data)
            if isinstance(event, contracts.StatusEvent) and event.status == end.status:
                error = event.error or ""
                break
    return end.status, end.result, error
