"""Live run events: the worker XADDs to the Redis stream ``run:<run_id>``, and SETs its heartbeat.

The stream's key, bound and event records, and the heartbeat's key and expiry, are the
contracts in ``gpu_worker/contracts.py``, shared with the control plane that reads them.

Publishing happens on a background thread fed by a bounded queue, so a slow or absent Redis
never delays a ``pred``. When Redis is unreachable (a restart, a failover) the thread keeps the
event and retries with backoff for up to ``RETRY_FOR_S``, so a short outage delays events
instead of losing them; past that, or when the queue is full, events are logged and dropped.
Events queued together (a forward's worth of streamed tokens) go in one round trip.
Heartbeats are never retried: the next one follows in seconds.

Every event is counted against its run's *account* in the Redis ledger of retained stream
bytes, in the same script that XADDs it (gpu_worker/stream_ledger.py). An event a LIP sends
(``send``) that would pass its account's share is not stored: the sender learns it from the
returned future, which it is given whenever the account's last known room, less what it has
queued, is within ``SYNC_MARGIN_BYTES`` of the event (or not known yet); far from the bound a
send stays fire-and-forget.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import Any

from gpu_worker import contracts, stream_ledger
from gpu_worker.contracts import HEARTBEAT_TTL_S, STREAM_MAXLEN, RunEvent
from gpu_worker.resource_model import Pool
from gpu_worker.stream_ledger import Refusal, StreamBudget

log = logging.getLogger(__name__)

QUEUE_MAX = 10_000
#: Most events sent in one Redis round trip (see ``EventPublisher._publish_batch``).
BATCH_MAX = 256
#: How long one event is retried while Redis is unreachable before it is dropped.
RETRY_FOR_S = 30.0
#: A send waits for its event to be stored (and learns of a refusal) when its account's room
#: is within this much of the event: room known from an earlier reply may be stale by what
#: other workers added meanwhile.
SYNC_MARGIN_BYTES = 4 * 1024 * 1024
#: Accounts whose room the publisher remembers (a bound on its memory, not on anyone's sends).
MAX_KNOWN_ACCOUNTS = 4096


@dataclass
class _Event:
    """One queued stream entry and who pays for it."""

    key: str
    type: str
    data: str
    account: str
    #: Refused past the account's share (a LIP's send), or only counted (the worker's own).
    enforce: bool
    cost: int
    outcome: Future[Refusal | None] | None = None


@dataclass
class _Heartbeat:
    key: str
    value: str
    ttl_s: int = HEARTBEAT_TTL_S


class EventPublisher:
    """Fire-and-forget XADD of ``{type, data}`` entries to per-run streams."""

    def __init__(self, redis_url: str, budget: StreamBudget | None = None) -> None:
        self._url = redis_url
        self.budget = budget or StreamBudget()
        self._queue: queue.Queue[_Event | _Heartbeat | None] = queue.Queue(QUEUE_MAX)
        self._client: Any = None
        self._script: Any = None
        #: ``PoolName.REDIS_BYTES``, measured from Redis's ``maxmemory`` on the first connection.
        self.pool: Pool | None = None
        self._redis_down = False
        self._lock = threading.Lock()
        #: Per account: its room at the last reply (its share less its holding, or the pool's free
        #: bytes if fewer), and the bytes it queued since.
        self._room: dict[str, int] = {}
        self._pending: dict[str, int] = {}
        self.published = 0
        self.dropped = 0
        self.refused = 0
        self._thread = threading.Thread(target=self._run, name="events", daemon=True)
        self._thread.start()

    def publish(self, run_id: str, account: str, event: RunEvent) -> None:
        """Queue one event of the worker's own (counted against ``account``, never refused);
        never blocks and never raises."""
        type_, payload = contracts.encode(event)
        self._put(run_id, account, type_, payload, enforce=False, outcome=None)

    def send(self, run_id: str, account: str, type_: str, payload: str) -> Future[Refusal | None] | None:
        """Queue one event a LIP sent, already encoded (``contracts.encode``), refused past its
        account's share of the Redis stream pool. Returns ``None`` when the account is far from
        its bound (fire-and-forget), else a future that resolves once the event was handled:
        to a :class:`Refusal` when it was not stored for that reason, else ``None`` (stored, or
        dropped because Redis stayed unreachable). Never blocks or raises."""
        cost = stream_ledger.stored_cost(contracts.entry_bytes(type_, payload))
        with self._lock:
            room = self._room.get(account)
            pending = self._pending.get(account, 0)
        near = room is None or room - pending < cost + SYNC_MARGIN_BYTES
        outcome: Future[Refusal | None] | None = Future() if near else None
        self._put(run_id, account, type_, payload, enforce=True, outcome=outcome)
        return outcome

    def known_room(self, account: str) -> int | None:
        """The account's room at the last reply less what it has queued since (``None``: not
        known yet): what a caller that cannot wait may check before sending."""
        with self._lock:
            room = self._room.get(account)
            return None if room is None else room - self._pending.get(account, 0)

    def _put(self, run_id: str, account: str, type_: str, payload: str, enforce: bool, outcome: Future | None) -> None:
        cost = stream_ledger.stored_cost(contracts.entry_bytes(type_, payload))
        event = _Event(contracts.run_stream_key(run_id), type_, payload, account, enforce, cost, outcome)
        with self._lock:
            self._pending[account] = self._pending.get(account, 0) + cost
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            log.warning("event=event_dropped reason=queue_full run=%s type=%s", run_id, type_)
            self._dropped([event])

    def heartbeat(self, name: str, info: dict[str, Any]) -> None:
        """Announce this worker (name, free pages, sessions) for the control plane's routing;
        the key expires after ``HEARTBEAT_TTL_S`` so a dead worker disappears by itself."""
        try:
            value = contracts.encode_heartbeat({**info, "name": name})
            self._queue.put_nowait(_Heartbeat(contracts.heartbeat_key(name), value))
        except queue.Full:
            self.dropped += 1

    def usage_checkpoint(self, run_id: str, usage: dict[str, Any]) -> None:
        """Keep ``usage`` as the run's usage so far (contracts: usage checkpoints), so a run
        whose executor or worker dies is still billed for it."""
        try:
            value = json.dumps(usage, default=str)
            key = contracts.usage_checkpoint_key(run_id)
            self._queue.put_nowait(_Heartbeat(key, value, contracts.USAGE_CHECKPOINT_TTL_S))
        except queue.Full:
            self.dropped += 1

    def _connect(self) -> Any:
        import redis

        if self._client is None:
            client = redis.Redis.from_url(self._url, socket_timeout=2, socket_connect_timeout=1)
            if self.pool is None:
                maxmemory = int(client.info("memory").get("maxmemory", 0))
                self.pool = self.budget.pool(maxmemory)
                log.info(
                    "event=redis_bytes_pool maxmemory=%d capacity=%d ceiling=%d",
                    maxmemory,
                    self.pool.capacity,
                    self.pool.ceiling,
                )
            self._script = client.register_script(stream_ledger.APPEND)
            self._client = client
        return self._client

    def _run(self) -> None:
        """The thread's loop. It must outlive anything one batch does: it is the only way every
        run on this worker reaches its user, so a batch that fails unexpectedly is logged and
        dropped (its senders stop waiting) and the next one goes on."""
        while True:
            batch = self._next_batch()
            stop = None in batch
            events = [item for item in batch if isinstance(item, _Event)]
            try:
                for item in batch:
                    if isinstance(item, _Heartbeat):
                        self._heartbeat(item.key, item.value, item.ttl_s)
                if events:
                    self._publish_batch(events)
            except Exception:
                log.exception("event=event_dropped reason=publisher_error count=%d", len(events))
                self._dropped(events)
            if stop:
                return

    def _next_batch(self) -> list[_Event | _Heartbeat | None]:
        """The next queued item (blocking) and whatever else is queued behind it, up to
        ``BATCH_MAX`` items, in queue order."""
        batch = [self._queue.get()]
        while len(batch) < BATCH_MAX and batch[-1] is not None:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return batch

    def _publish_batch(self, events: list[_Event]) -> None:
        """XADD ``events`` in one script call (one round trip), retried whole while Redis is down.

        Why batched: a streaming LIP sends one event per token, so a forward at batch 64 queues
        64 of them at once; one XADD each cost ~160 us of this process's CPU (~240 us with Redis's
        own), on the cores the next forward needs, against ~25 us each in a batch of 64.
        Why one script: a batch cut off by a failure has then either landed whole or not at
        all, so resending it never duplicates the events that had landed; and each event is
        counted in the ledger with its XADD (gpu_worker/stream_ledger.py).
        After one batch gave up, Redis counts as down: one try per batch (no backlog of 30 s
        waits) until a send succeeds again."""
        give_up = time.monotonic() + (0.0 if self._redis_down else RETRY_FOR_S)
        backoff = 0.1
        while (replies := self._xadd_all(events)) is None:
            if time.monotonic() + backoff > give_up:
                self._redis_down = True
                streams = ",".join(sorted({event.key for event in events}))
                log.warning("event=event_dropped reason=redis_unreachable count=%d streams=%s", len(events), streams)
                self._dropped(events)
                return
            time.sleep(backoff)
            backoff = min(2.0, backoff * 2)
        self._redis_down = False
        self._settle(events, replies)

    def _xadd_all(self, events: list[_Event]) -> list[int] | None:
        """One script call of XADDs (``stream_ledger.APPEND``): five integers per event, or
        ``None`` on failure (the connection is dropped so the next try reconnects)."""
        try:
            self._connect()
            assert self.pool is not None and self._script is not None
            pool = self.pool
            args: list[Any] = [
                pool.capacity,
                pool.ceiling,
                self.budget.running_ttl_s * 1000,
                STREAM_MAXLEN,
                stream_ledger.SWEEP_MAX,
            ]
            for e in events:
                args += [e.key, e.account, int(e.enforce), e.cost, e.type, e.data]
            return [int(v) for v in self._script(keys=list(stream_ledger.KEYS), args=args)]
        except Exception as exc:  # redis raises many types; none may reach a LIP
            self._client = None
            log.warning("event=redis_error error=%r events=%d", exc, len(events))
            return None

    def _settle(self, events: list[_Event], replies: list[int]) -> None:
        """Record each event's outcome: the account's room, and the sender's future."""
        assert self.pool is not None
        for i, event in enumerate(events):
            n = stream_ledger.REPLY_FIELDS
            stored, held, limit, accounts, free = replies[n * i : n * i + n]
            with self._lock:
                self._unpend(event)
                if len(self._room) >= MAX_KNOWN_ACCOUNTS and event.account not in self._room:
                    self._room.clear()  # forgotten rooms only make the next sends wait once
                self._room[event.account] = min(limit - held, free)
            refusal = None
            if stored:
                self.published += 1
            else:
                self.refused += 1
                refusal = Refusal(held, event.cost, limit, accounts, free, self.pool)
                log.warning(
                    "event=stream_bytes_refused account=%s stream=%s held=%d cost=%d limit=%d",
                    event.account,
                    event.key,
                    held,
                    event.cost,
                    limit,
                )
            _resolve(event.outcome, refusal)

    def _unpend(self, event: _Event) -> None:
        """``event`` is no longer queued (call with the lock held)."""
        left = self._pending.get(event.account, 0) - event.cost
        if left > 0:
            self._pending[event.account] = left
        else:
            self._pending.pop(event.account, None)

    def _dropped(self, events: list[_Event]) -> None:
        self.dropped += len(events)
        for event in events:
            with self._lock:
                self._unpend(event)
            _resolve(event.outcome, None)

    def _heartbeat(self, key: str, data: str, ttl_s: int = HEARTBEAT_TTL_S) -> None:
        """One SET with a TTL, never retried: the next heartbeat follows in seconds."""
        try:
            self._connect().set(key, data, ex=ttl_s)
        except Exception as exc:
            self._client = None
            log.warning("event=redis_error error=%r key=%s", exc, key)

    def close(self, timeout: float = 2.0) -> None:
        """Flush what is queued (bounded by ``timeout``) and stop the thread."""
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            return
        self._thread.join(timeout)


def _resolve(outcome: Future[Refusal | None] | None, refusal: Refusal | None) -> None:
    """Tell a waiting sender what became of its event. Its wait may have been cancelled (the
    LIP's connection closed while ``send_to_user`` waited: ``asyncio.wrap_future`` cancels the
    future with it); the event was handled all the same, and nobody is left to tell."""
    if outcome is None:
        return
    try:
        outcome.set_result(refusal)
    except InvalidStateError:
        log.info("event=send_wait_gone refused=%s", refusal is not None)
