"""What a run sends out or waits on: its client stream (``send_to_user``), its result
(``finish``), brokered HTTP and sleep (both of which may swap the session's KV out)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
from typing import TYPE_CHECKING

import msgpack

from gpu_worker import brokered_io, contracts
from gpu_worker import protocol as p
from gpu_worker.ops.context import OpContext
from gpu_worker.ops.registry import lip_op
from gpu_worker.protocol import MAX_TEXT_CHARS, ErrorCode, ProtocolError
from gpu_worker.sessions import WorkerSession
from gpu_worker.stream_ledger import Refusal

if TYPE_CHECKING:
    from gpu_worker.events import EventPublisher

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 1024 * 1024


def bad(message: str) -> ProtocolError:
    return ProtocolError(ErrorCode.BAD_ARGS, message)


@lip_op(p.Finish)
async def finish(ctx: OpContext, s: WorkerSession, args: p.Finish) -> None:
    s.set_result(args.result, args.error)
    log.info("event=finish session=%s tenant=%s run=%s", s.session_id, s.tenant, s.run_id)


@lip_op(p.SendToUser)
async def send_to_user(ctx: OpContext, s: WorkerSession, args: p.SendToUser) -> None:
    """Publish one event to the run's stream, bounded per message (``MAX_MESSAGE_BYTES``, EINVAL),
    per run (the plan's ``stream_bytes_per_run``, EDQUOT), both counted in bytes as stored, and
    per account across its retained streams (its share of Redis, gpu_worker/stream_ledger.py:
    EDQUOT, nothing stored). Near that bound the send waits for its event to be stored."""
    data = args.data
    if isinstance(data, str):
        if len(data) > MAX_TEXT_CHARS:
            raise bad(f"text longer than {MAX_TEXT_CHARS} characters")
        type_, payload = contracts.encode(contracts.TokenEvent(data))
    else:
        if isinstance(data, bytes) or len(msgpack.packb(data, use_bin_type=True)) > MAX_MESSAGE_BYTES:
            raise bad(f"message must be JSON-like data of at most {MAX_MESSAGE_BYTES} bytes")
        try:
            # What readers of the stream parse is JSON: NaN, Infinity or bytes inside would reach
            # a browser's JSON.parse or an OpenAI client as something they cannot read.
            json.dumps(data, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise bad(f"message must be JSON data: {exc}") from None
        type_, payload = contracts.encode(contracts.MessageEvent(data))
    size = contracts.entry_bytes(type_, payload)
    if size > MAX_MESSAGE_BYTES:
        raise bad(f"message of {size} bytes (as JSON, UTF-8) is over the {MAX_MESSAGE_BYTES} one send_to_user may send")
    outcome = publish_metered(ctx.events, s, type_, payload, size)
    if outcome is None:
        return
    refusal = await asyncio.wrap_future(outcome)
    if refusal is not None:
        s.refund_stream_bytes(size)
        raise ProtocolError(ErrorCode.QUOTA, refusal.message())


def publish_metered(
    events: EventPublisher, s: WorkerSession, type_: str, payload: str, size: int
) -> concurrent.futures.Future[Refusal | None] | None:
    """What every event a program sends its client costs, ``send_to_user``'s and a ``pred``'s
    streamed text alike: ``size`` (the event as stored, ``contracts.entry_bytes``) spent from
    the run's stream bytes (``ProtocolError`` EDQUOT past them, nothing published), then the
    event published. The future, when there is one (the account is near its share of the stored
    streams), says whether the store kept it; on a refusal the caller refunds ``size``."""
    s.spend_stream_bytes(size)
    return events.send(s.run_id, s.account, type_, payload)


@lip_op(p.HttpFetch)
async def http_fetch(ctx: OpContext, s: WorkerSession, args: p.HttpFetch) -> p.HttpReply:
    s.check_deadline()
    cap = ctx.http_timeout_s
    left = s.time_left()
    if left is not None:
        cap = min(cap, left)
    req = brokered_io.parse_request(args, cap)
    s.usage.io_calls += 1
    dest = await ctx.in_thread(brokered_io.check_allowed, req, list(s.limits.allowed_hosts))
    log.info(
        "event=http_fetch session=%s tenant=%s run=%s host=%s:%d", s.session_id, s.tenant, s.run_id, req.host, req.port
    )
    return await ctx.blocked_on_io(s, ctx.in_thread(brokered_io.fetch, req, dest, ctx.http_max_bytes))


@lip_op(p.Sleep)
async def sleep(ctx: OpContext, s: WorkerSession, args: p.Sleep) -> None:
    seconds = args.seconds
    s.check_deadline()
    s.usage.io_calls += 1
    left = s.time_left()
    if left is not None and seconds > left:
        await ctx.blocked_on_io(s, asyncio.sleep(max(left, 0)))
        raise ProtocolError(ErrorCode.TIMEOUT, f"run deadline of {s.limits.deadline_s}s passed during sleep")
    await ctx.blocked_on_io(s, asyncio.sleep(seconds))
