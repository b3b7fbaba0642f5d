"""Channel ops: messages between the runs of one run tree, through the worker's broker
(``gpu_worker/channels.py``). Sends and publishes are recorded as ``channel`` events on the
sending run's stream (counted against its stream budget and its account's share of Redis,
gpu_worker/stream_ledger.py); reads wait like brokered I/O (the
session leaves the batch barrier, and its KV may swap out while it waits), bounded by the read's
``timeout`` and the run's deadline."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from gpu_worker import contracts, stream_ledger
from gpu_worker import protocol as p
from gpu_worker.channels import Message, encoded_size
from gpu_worker.ops import channel_senders
from gpu_worker.ops.context import OpContext
from gpu_worker.ops.registry import lip_op
from gpu_worker.protocol import ErrorCode, ProtocolError
from gpu_worker.sessions import WorkerSession

T = TypeVar("T")


def _recorded(ctx: OpContext, s: WorkerSession, op: str, name: str, data: Any, deliver: Callable[[int], T]) -> T:
    """Check ``data``, count its event against the run's stream budget (EDQUOT before anything
    is queued), ``deliver`` it (given its size), then publish the event on the sender's stream.
    A delivery the broker refuses gives the budget back and records nothing. An account whose
    known room in Redis (``EventPublisher.known_room``) cannot take the event gets EDQUOT
    before delivery; the publish itself is refused past the share like any send."""
    size = encoded_size(data)
    type_, payload = contracts.encode(contracts.ChannelEvent(name, op, data, size))
    cost = contracts.entry_bytes(type_, payload)
    room = ctx.events.known_room(s.account)
    if room is not None and room < stream_ledger.stored_cost(cost):
        raise ProtocolError(
            ErrorCode.QUOTA,
            f"Redis bound on retained event streams reached: this account has {max(0, room)} bytes of its"
            f" share left and the channel event takes {stream_ledger.stored_cost(cost)} (the account-wide"
            " bound on retained event streams; streams are freed when they expire after the run ends)",
        )
    s.spend_stream_bytes(cost, to_user=False)
    try:
        out = deliver(size)
    except BaseException:
        s.refund_stream_bytes(cost)
        raise
    ctx.events.send(s.run_id, s.account, type_, payload)
    return out


def _wait_bound(s: WorkerSession, timeout: float | None) -> tuple[float | None, bool]:
    """The seconds a read may wait and whether the run's deadline (not ``timeout``) bounds it."""
    s.check_deadline()
    left = s.time_left()
    if left is not None and (timeout is None or left < timeout):
        return left, True
    return timeout, False


async def _read(
    ctx: OpContext,
    s: WorkerSession,
    timeout: float | None,
    what: str,
    read: Callable[[float | None, asyncio.Future[ProtocolError] | None], Awaitable[Message]],
) -> p.ChannelMessage:
    """A read bounded by ``timeout`` and the deadline, which stops waiting with ECHANCLOSED
    (``senders_gone``) when no run is left that could send (``channel_senders``)."""
    bound, by_deadline = _wait_bound(s, timeout)
    gone = channel_senders.watch(ctx, s, what)
    try:
        msg: Message = await ctx.blocked_on_io(s, read(bound, gone))
    except ProtocolError as exc:
        if by_deadline and exc.code == ErrorCode.CHANNEL_TIMEOUT:
            raise s.deadline_error() from None
        raise
    finally:
        if gone is not None:
            gone.cancel()
    return p.ChannelMessage(data=msg.data, sender=msg.sender)


@lip_op(p.ChannelSend)
async def channel_send(ctx: OpContext, s: WorkerSession, args: p.ChannelSend) -> None:
    _recorded(ctx, s, "send", args.name, args.data, lambda size: ctx.channels.send(s, args.name, args.data, size))


@lip_op(p.ChannelRecv)
async def channel_recv(ctx: OpContext, s: WorkerSession, args: p.ChannelRecv) -> p.ChannelMessage:
    return await _read(
        ctx, s, args.timeout, f"channel {args.name!r}", lambda t, gone: ctx.channels.recv(s, args.name, t, gone)
    )


@lip_op(p.ChannelPublish)
async def channel_publish(ctx: OpContext, s: WorkerSession, args: p.ChannelPublish) -> int:
    return _recorded(
        ctx, s, "publish", args.name, args.data, lambda size: ctx.channels.publish(s, args.name, args.data, size)
    )


@lip_op(p.ChannelSubscribe)
async def channel_subscribe(ctx: OpContext, s: WorkerSession, args: p.ChannelSubscribe) -> p.SubscriptionRef:
    return p.SubscriptionRef(sub=ctx.channels.subscribe(s, args.name))


@lip_op(p.ChannelNext)
async def channel_next(ctx: OpContext, s: WorkerSession, args: p.ChannelNext) -> p.ChannelMessage:
    return await _read(
        ctx, s, args.timeout, f"subscription {args.sub}", lambda t, gone: ctx.channels.next(s, args.sub, t, gone)
    )


@lip_op(p.ChannelUnsubscribe)
async def channel_unsubscribe(ctx: OpContext, s: WorkerSession, args: p.ChannelUnsubscribe) -> None:
    ctx.channels.unsubscribe(s, args.sub)


@lip_op(p.ChannelClose)
async def channel_close(ctx: OpContext, s: WorkerSession, args: p.ChannelClose) -> None:
    ctx.channels.close(s, args.name)
