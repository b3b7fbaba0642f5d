"""Channels: named message queues between the runs of one run tree, brokered by the worker.

A run tree is the root run and the runs it spawned; the control plane names it in
``create_session`` (``tree``, the root run's id; a run alone is its own tree). Sessions of the
same tenant **and** the same tree share one namespace of channels; nothing crosses trees or
tenants, because the key of every channel is ``(tenant, tree, name)`` and a session can only
name its own ``(tenant, tree)``.

A channel carries JSON values two ways:

* **queue** (``send`` / ``recv``): each message goes to exactly one receiver, in order; a
  ``recv`` waits (without holding the event loop: it awaits a future) until a message comes, its
  ``timeout`` passes or the run's deadline does.
* **broadcast** (``publish`` / ``subscribe`` + ``next``): each subscription gets every message
  published after it was made, in order; a publish with no subscriber reaches nobody.

Every bound is explicit, so a program cannot grow the worker's memory: a message is at most
``protocol.MAX_CHANNEL_MESSAGE_BYTES`` as JSON; a queue (and each subscription's) holds at most
``MAX_QUEUED`` messages (``ECHANFULL`` past it); a tree has at most ``MAX_CHANNELS`` channels
(``ECHANLIMIT``); a session at most ``MAX_SUBSCRIPTIONS``; and the bytes queued by one tenant,
all trees together, at most ``max_tenant_bytes`` (``ECHANFULL``). When the last session of a
tree leaves, its channels, queues and subscriptions are dropped.

The broker runs on the worker's event loop only (no locks): its methods are called by the op
handlers in ``gpu_worker/ops/channels.py`` and by the worker's session lifecycle.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from gpu_worker.protocol import CHANNEL_NAME_PATTERN, MAX_CHANNEL_MESSAGE_BYTES, ErrorCode, ProtocolError

#: Messages one queue (a channel's, or one subscription's) may hold.
MAX_QUEUED = 256
#: Channels one run tree may have (a name is a channel from its first use until the tree ends).
MAX_CHANNELS = 64
#: Subscriptions one session may hold at once.
MAX_SUBSCRIPTIONS = 64
#: Bytes (as JSON) one tenant may have queued on this worker, all its trees together (the
#: worker's ``WorkerConfig.channel_bytes_per_tenant``).
DEFAULT_MAX_TENANT_BYTES = 16 * 1024 * 1024
#: A channel name: local to its tree, so it has no separators that could look like a path to
#: another tree's channel ("other-tree/x", "../x").
NAME_RE = re.compile(CHANNEL_NAME_PATTERN)


def check_name(name: str) -> str:
    if not NAME_RE.fullmatch(name) or name in (".", ".."):
        raise ProtocolError(
            ErrorCode.BAD_ARGS,
            f"channel name {name[:140]!r} is not valid: 1-128 letters, digits, '_', '.' or '-'; a name is"
            " always local to the caller's run tree (there is no way to name another tree's channel)",
        )
    return name


def encoded_size(data: Any) -> int:
    """Bytes of ``data`` as compact UTF-8 JSON; EINVAL for a value JSON cannot carry, EMSGSIZE
    past ``MAX_CHANNEL_MESSAGE_BYTES``."""
    try:
        text = json.dumps(data, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise ProtocolError(ErrorCode.BAD_ARGS, f"a channel message must be JSON data: {exc}") from None
    size = len(text.encode("utf-8"))
    if size > MAX_CHANNEL_MESSAGE_BYTES:
        raise ProtocolError(
            ErrorCode.MESSAGE_TOO_LARGE,
            f"message of {size} bytes (as JSON) is over the {MAX_CHANNEL_MESSAGE_BYTES} a channel message may be",
        )
    return size


@dataclass(frozen=True)
class Message:
    data: Any
    size: int
    #: The run id of the session that sent it.
    sender: str


@dataclass(eq=False)
class _Queue:
    """Messages waiting for a reader, and readers waiting for a message (never both)."""

    messages: deque[Message] = field(default_factory=deque)
    waiters: deque[asyncio.Future[Message]] = field(default_factory=deque)

    def hand_off(self, msg: Message) -> bool:
        """Give ``msg`` to the first reader still waiting; False when none is."""
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_result(msg)
                return True
        return False

    def has_waiter(self) -> bool:
        return any(not f.done() for f in self.waiters)

    def fail_waiters(self, error: ProtocolError) -> None:
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_exception(error)


@dataclass(eq=False)
class Subscription:
    sub_id: int
    session_id: str
    channel: Channel
    queue: _Queue = field(default_factory=_Queue)


@dataclass(eq=False)
class Channel:
    name: str
    tree: Tree
    queue: _Queue = field(default_factory=_Queue)
    subs: dict[int, Subscription] = field(default_factory=dict)
    closed: bool = False


@dataclass(eq=False)
class Tree:
    tenant: str
    tree_id: str
    sessions: set[str] = field(default_factory=set)
    channels: dict[str, Channel] = field(default_factory=dict)
    #: Resolved (and dropped) whenever a session of the tree leaves (:meth:`ChannelBroker.member_left`).
    leave_waiters: list[asyncio.Future[None]] = field(default_factory=list)


@dataclass(frozen=True)
class Member:
    """What the broker needs of a session (``WorkerSession`` has these attributes)."""

    session_id: str
    tenant: str
    tree: str
    run_id: str


class ChannelBroker:
    """Every channel of every tree on this worker; see the module docstring."""

    def __init__(self, max_tenant_bytes: int = DEFAULT_MAX_TENANT_BYTES) -> None:
        self.max_tenant_bytes = max_tenant_bytes
        self._trees: dict[tuple[str, str], Tree] = {}
        self._member_tree: dict[str, Tree] = {}
        self._subs: dict[str, dict[int, Subscription]] = {}
        #: The futures each session's reads wait on: failed when it leaves, so a message sent
        #: meanwhile is queued for a live reader instead of handed to a dying one.
        self._waiting: dict[str, set[asyncio.Future[Message]]] = {}
        self._tenant_bytes: dict[str, int] = {}
        self._sub_ids = itertools.count(1)
        self.sent = 0
        self.published = 0

    # ------------------------------------------------------------------ membership
    def join(self, m: Any) -> None:
        """Make session ``m`` (``session_id``, ``tenant``, ``tree``) a member of its tree."""
        key = (m.tenant, m.tree)
        tree = self._trees.get(key)
        if tree is None:
            tree = self._trees[key] = Tree(m.tenant, m.tree)
        tree.sessions.add(m.session_id)
        self._member_tree[m.session_id] = tree

    def leave(self, session_id: str) -> None:
        """Drop the session's subscriptions and fail its waiting reads; the last session of a
        tree to leave frees the tree's channels and every message still queued in them."""
        tree = self._member_tree.pop(session_id, None)
        gone = ProtocolError(ErrorCode.CHANNEL_CLOSED, "the session ended")
        for fut in self._waiting.pop(session_id, set()):
            if not fut.done():
                fut.set_exception(gone)
        for sub in list(self._subs.get(session_id, {}).values()):
            self._drop_sub(sub, ProtocolError(ErrorCode.CHANNEL_CLOSED, "the session ended"))
        self._subs.pop(session_id, None)
        if tree is None:
            return
        tree.sessions.discard(session_id)
        waiters, tree.leave_waiters = tree.leave_waiters, []
        for left in waiters:
            if not left.done():
                left.set_result(None)
        if tree.sessions:
            return
        ended = ProtocolError(ErrorCode.CHANNEL_CLOSED, "the run tree ended")
        for ch in tree.channels.values():
            ch.queue.fail_waiters(ended)
            self._unqueue(tree.tenant, ch.queue)
            for sub in list(ch.subs.values()):
                self._drop_sub(sub, ended)
        tree.channels.clear()
        del self._trees[(tree.tenant, tree.tree_id)]

    def others_in_tree(self, m: Any) -> int:
        """How many sessions of ``m``'s tree on this worker are not ``m`` (the runs that could
        still send to it); 0 when ``m`` has left."""
        tree = self._member_tree.get(m.session_id)
        return 0 if tree is None else len(tree.sessions - {m.session_id})

    def member_left(self, m: Any) -> asyncio.Future[None]:
        """A future resolved when the next session of ``m``'s tree leaves (at once when ``m``
        has left already)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        tree = self._member_tree.get(m.session_id)
        if tree is None:
            fut.set_result(None)
        else:
            tree.leave_waiters.append(fut)
        return fut

    # --------------------------------------------------------------------- queue form
    def send(self, m: Any, name: str, data: Any, size: int | None = None) -> Message:
        """Queue ``data`` for one receiver of ``name`` (handed to a waiting one at once);
        ``size``: its :func:`encoded_size` when the caller has it already."""
        size = encoded_size(data) if size is None else size
        ch = self._channel(m, name)
        self._open(ch)
        msg = Message(data, size, m.run_id)
        if not ch.queue.hand_off(msg):
            if len(ch.queue.messages) >= MAX_QUEUED:
                raise ProtocolError(
                    ErrorCode.CHANNEL_FULL,
                    f"channel {name!r} holds {MAX_QUEUED} unread messages (its bound); a receiver must recv some first",
                )
            self._charge(m.tenant, size)
            ch.queue.messages.append(msg)
        self.sent += 1
        return msg

    async def recv(
        self, m: Any, name: str, timeout: float | None, abandon: asyncio.Future[ProtocolError] | None = None
    ) -> Message:
        """The oldest message of ``name``, waiting up to ``timeout`` seconds (None: no bound
        here; the caller bounds it by the run's deadline). ``abandon``: when it resolves before a
        message comes, the read stops waiting and raises the error it resolved with (nothing is
        lost: a message handed to this read first is returned)."""
        ch = self._channel(m, name)
        return await self._read(m, ch, ch.queue, f"channel {name!r}", timeout, abandon)

    # ----------------------------------------------------------------- broadcast form
    def subscribe(self, m: Any, name: str) -> int:
        ch = self._channel(m, name)
        self._open(ch)
        mine = self._subs.setdefault(m.session_id, {})
        if len(mine) >= MAX_SUBSCRIPTIONS:
            raise ProtocolError(
                ErrorCode.TOO_MANY_CHANNELS,
                f"this run holds {MAX_SUBSCRIPTIONS} subscriptions (the bound); unsubscribe some first",
            )
        sub = Subscription(next(self._sub_ids), m.session_id, ch)
        mine[sub.sub_id] = sub
        ch.subs[sub.sub_id] = sub
        return sub.sub_id

    def publish(self, m: Any, name: str, data: Any, size: int | None = None) -> int:
        """Deliver ``data`` to every subscription of ``name``; how many it reached. All or
        none: a subscription whose queue is full refuses the whole publish."""
        size = encoded_size(data) if size is None else size
        ch = self._channel(m, name)
        self._open(ch)
        msg = Message(data, size, m.run_id)
        subs = list(ch.subs.values())
        queued = [s for s in subs if not s.queue.has_waiter()]
        if any(len(s.queue.messages) >= MAX_QUEUED for s in queued):
            raise ProtocolError(
                ErrorCode.CHANNEL_FULL,
                f"a subscriber of channel {name!r} has {MAX_QUEUED} unread messages (the bound); nothing was published",
            )
        self._charge(m.tenant, size * len(queued))
        for s in subs:
            if not s.queue.hand_off(msg):
                s.queue.messages.append(msg)
        self.published += 1
        return len(subs)

    async def next(
        self, m: Any, sub_id: int, timeout: float | None, abandon: asyncio.Future[ProtocolError] | None = None
    ) -> Message:
        sub = self._sub(m, sub_id)
        return await self._read(m, sub.channel, sub.queue, f"subscription to {sub.channel.name!r}", timeout, abandon)

    def unsubscribe(self, m: Any, sub_id: int) -> None:
        self._drop_sub(self._sub(m, sub_id), ProtocolError(ErrorCode.CHANNEL_CLOSED, "unsubscribed"))

    def close(self, m: Any, name: str) -> None:
        """No more messages on ``name``: sends and publishes fail, reads drain what is queued and
        then fail with ECHANCLOSED (readers waiting now fail at once)."""
        ch = self._channel(m, name)
        if ch.closed:
            return
        ch.closed = True
        closed = ProtocolError(ErrorCode.CHANNEL_CLOSED, f"channel {name!r} was closed")
        ch.queue.fail_waiters(closed)
        for sub in ch.subs.values():
            sub.queue.fail_waiters(closed)

    # ---------------------------------------------------------------------- metrics
    def stats(self) -> dict[str, Any]:
        return {
            "trees": len(self._trees),
            "channels": sum(len(t.channels) for t in self._trees.values()),
            "subscriptions": sum(len(v) for v in self._subs.values()),
            "queued_bytes": sum(self._tenant_bytes.values()),
            "sent": self.sent,
            "published": self.published,
        }

    def tenant_bytes(self, tenant: str) -> int:
        return self._tenant_bytes.get(tenant, 0)

    # ---------------------------------------------------------------------- helpers
    def _tree(self, m: Any) -> Tree:
        tree = self._member_tree.get(m.session_id)
        if tree is None:
            raise ProtocolError(ErrorCode.CHANNEL_CLOSED, "this run's session has ended; its channels are gone")
        return tree

    def _channel(self, m: Any, name: str) -> Channel:
        tree = self._tree(m)
        check_name(name)
        ch = tree.channels.get(name)
        if ch is None:
            if len(tree.channels) >= MAX_CHANNELS:
                raise ProtocolError(
                    ErrorCode.TOO_MANY_CHANNELS,
                    f"this run tree has {MAX_CHANNELS} channels (the bound); reuse one of them",
                )
            ch = tree.channels[name] = Channel(name, tree)
        return ch

    def _open(self, ch: Channel) -> None:
        if ch.closed:
            raise ProtocolError(ErrorCode.CHANNEL_CLOSED, f"channel {ch.name!r} was closed")

    def _sub(self, m: Any, sub_id: int) -> Subscription:
        self._tree(m)
        sub = self._subs.get(m.session_id, {}).get(sub_id)
        if sub is None:
            raise ProtocolError(ErrorCode.NOT_FOUND, f"no subscription {sub_id} in this run")
        return sub

    async def _read(
        self,
        m: Any,
        ch: Channel,
        q: _Queue,
        what: str,
        timeout: float | None,
        abandon: asyncio.Future[ProtocolError] | None,
    ) -> Message:
        if q.messages:
            msg = q.messages.popleft()
            self._refund(m.tenant, msg.size)
            return msg
        if ch.closed:
            raise ProtocolError(ErrorCode.CHANNEL_CLOSED, f"channel {ch.name!r} was closed and is drained")
        fut: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        q.waiters.append(fut)
        mine = self._waiting.setdefault(m.session_id, set())
        mine.add(fut)
        try:
            waits: set[asyncio.Future[Any]] = {fut} if abandon is None else {fut, abandon}
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            if fut.done():
                return fut.result()
            if abandon is not None and abandon.done():
                raise abandon.result()
            raise ProtocolError(ErrorCode.CHANNEL_TIMEOUT, f"no message on {what} within {timeout:g} s")
        finally:
            if not fut.done():
                fut.cancel()
            if fut in q.waiters:
                q.waiters.remove(fut)
            mine.discard(fut)
            if not mine and self._waiting.get(m.session_id) is mine:
                del self._waiting[m.session_id]

    def _drop_sub(self, sub: Subscription, error: ProtocolError) -> None:
        sub.queue.fail_waiters(error)
        self._unqueue(sub.channel.tree.tenant, sub.queue)
        sub.channel.subs.pop(sub.sub_id, None)
        mine = self._subs.get(sub.session_id)
        if mine is not None:
            mine.pop(sub.sub_id, None)

    def _unqueue(self, tenant: str, q: _Queue) -> None:
        self._refund(tenant, sum(msg.size for msg in q.messages))
        q.messages.clear()

    def _charge(self, tenant: str, n: int) -> None:
        held = self._tenant_bytes.get(tenant, 0)
        if held + n > self.max_tenant_bytes:
            raise ProtocolError(
                ErrorCode.CHANNEL_FULL,
                f"this tenant has {held} bytes of unread channel messages on this worker and {n} more"
                f" would pass its bound of {self.max_tenant_bytes}; receivers must read some first",
            )
        self._tenant_bytes[tenant] = held + n

    def _refund(self, tenant: str, n: int) -> None:
        left = self._tenant_bytes.get(tenant, 0) - n
        if left > 0:
            self._tenant_bytes[tenant] = left
        else:
            self._tenant_bytes.pop(tenant, None)
