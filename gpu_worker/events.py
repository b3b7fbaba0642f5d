"""Live run events: the worker XADDs to the Redis stream ``run:<run_id>``, and SETs its heartbeat.

The stream's key, bound and event records, and the heartbeat's key and expiry, are the
contracts in ``gpu_worker/contracts.py``, shared with the control plane that reads them.

Publishing happens on a background thread fed by a bounded queue, so a slow or absent Redis
never delays a ``pred``. When Redis is unreachable (a restart, a failover) the thread keeps the
event and retries with backoff for up to ``RETRY_FOR_S``, so a short outage delays events
instead of losing them; past that, or when the queue is full, events are logged and dropped.
Events queued together (a forward's worth of streamed tokens) go in one round trip.
Heartbeats are never retried: the next one follows in seconds.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any

from gpu_worker import contracts
from gpu_worker.contracts import HEARTBEAT_PREFIX, HEARTBEAT_TTL_S, STREAM_MAXLEN, RunEvent

log = logging.getLogger(__name__)

QUEUE_MAX = 10_000
#: Most events sent in one Redis round trip (see ``EventPublisher._publish_batch``).
BATCH_MAX = 256
#: How long one event is retried while Redis is unreachable before it is dropped.
RETRY_FOR_S = 30.0


class EventPublisher:
    """Fire-and-forget XADD of ``{type, data}`` entries to per-run streams."""

    def __init__(self, redis_url: str) -> None:
        self._url = redis_url
        self._queue: queue.Queue[tuple[str, str, str] | None] = queue.Queue(QUEUE_MAX)
        self._client: Any = None
        self._redis_down = False
        self.published = 0
        self.dropped = 0
        self._thread = threading.Thread(target=self._run, name="events", daemon=True)
        self._thread.start()

    def publish(self, run_id: str, event: RunEvent) -> None:
        """Queue one event; never blocks and never raises."""
        self.publish_encoded(run_id, *contracts.encode(event))

    def publish_encoded(self, run_id: str, type_: str, payload: str) -> None:
        """Queue one event already encoded (``contracts.encode``: a caller that counted its
        bytes first); never blocks or raises."""
        try:
            self._queue.put_nowait((contracts.run_stream_key(run_id), type_, payload))
        except queue.Full:
            self.dropped += 1
            log.warning("event=event_dropped reason=queue_full run=%s type=%s", run_id, type_)

    def heartbeat(self, name: str, info: dict[str, Any]) -> None:
        """Announce this worker (name, free pages, sessions) for the control plane's routing;
        the key expires after ``HEARTBEAT_TTL_S`` so a dead worker disappears by itself."""
        try:
            value = contracts.encode_heartbeat({**info, "name": name})
            self._queue.put_nowait((contracts.heartbeat_key(name), "", value))
        except queue.Full:
            self.dropped += 1

    def _connect(self) -> Any:
        import redis

        if self._client is None:
            self._client = redis.Redis.from_url(self._url, socket_timeout=2, socket_connect_timeout=1)
        return self._client

    def _run(self) -> None:
        while True:
            batch = self._next_batch()
            stop = None in batch
            items = [item for item in batch if item is not None]
            events = [item for item in items if not item[0].startswith(HEARTBEAT_PREFIX)]
            for key, _, data in items:
                if key.startswith(HEARTBEAT_PREFIX):
                    self._heartbeat(key, data)
            if events:
                self._publish_batch(events)
            if stop:
                return

    def _next_batch(self) -> list[tuple[str, str, str] | None]:
        """The next queued item (blocking) and whatever else is queued behind it, up to
        ``BATCH_MAX`` items, in queue order."""
        batch = [self._queue.get()]
        while len(batch) < BATCH_MAX and batch[-1] is not None:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return batch

    def _publish_batch(self, events: list[tuple[str, str, str]]) -> None:
        """XADD ``events`` in one MULTI/EXEC round trip, retried whole while Redis is down.

        Why batched: a streaming LIP sends one event per token, so a forward at batch 64 queues
        64 of them at once; one XADD each cost ~160 us of this process's CPU (~240 us with Redis's
        own), on the cores the next forward needs, against ~25 us each in a batch of 64.
        Why a transaction: a batch cut off by a failure has then either landed whole or not at
        all, so resending it never duplicates the events that had landed.
        After one batch gave up, Redis counts as down: one try per batch (no backlog of 30 s
        waits) until a send succeeds again."""
        give_up = time.monotonic() + (0.0 if self._redis_down else RETRY_FOR_S)
        backoff = 0.1
        while not self._xadd_all(events):
            if time.monotonic() + backoff > give_up:
                self.dropped += len(events)
                self._redis_down = True
                streams = ",".join(sorted({key for key, _, _ in events}))
                log.warning("event=event_dropped reason=redis_unreachable count=%d streams=%s", len(events), streams)
                return
            time.sleep(backoff)
            backoff = min(2.0, backoff * 2)
        self.published += len(events)
        self._redis_down = False

    def _xadd_all(self, events: list[tuple[str, str, str]]) -> bool:
        """One transaction of XADDs; on failure drop the connection so the next try reconnects."""
        try:
            pipe = self._connect().pipeline(transaction=True)
            for key, type_, data in events:
                fields = {contracts.TYPE_FIELD: type_, contracts.DATA_FIELD: data}
                pipe.xadd(key, fields, maxlen=STREAM_MAXLEN, approximate=True)
            pipe.execute()
            return True
        except Exception as exc:  # redis raises many types; none may reach a LIP
            self._client = None
            log.warning("event=redis_error error=%r events=%d", exc, len(events))
            return False

    def _heartbeat(self, key: str, data: str) -> None:
        """One SET with a TTL, never retried: the next heartbeat follows in seconds."""
        try:
            self._connect().set(key, data, ex=HEARTBEAT_TTL_S)
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
