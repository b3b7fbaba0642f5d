"""Live run events: the worker XADDs to the Redis stream ``run:<run_id>``.

Publishing happens on a background thread fed by a bounded queue, so a slow or absent Redis
never delays a ``pred``. When Redis is unreachable (a restart, a failover) the thread keeps the
event and retries with backoff for up to ``RETRY_FOR_S``, so a short outage delays events
instead of losing them; past that, or when the queue is full, events are logged and dropped.
Heartbeats are never retried: the next one follows in seconds.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from typing import Any

log = logging.getLogger(__name__)

STREAM_MAXLEN = 10_000
QUEUE_MAX = 10_000


#: Workers announce themselves under ``symphony:worker:<name>``; the key expires when they stop.
HEARTBEAT_PREFIX = "symphony:worker:"
HEARTBEAT_TTL_S = 10
#: How long one event is retried while Redis is unreachable before it is dropped.
RETRY_FOR_S = 30.0


def stream_key(run_id: str) -> str:
    return f"run:{run_id}"


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

    def publish(self, run_id: str, type_: str, data: Any) -> None:
        """Queue one event; never blocks and never raises."""
        try:
            self._queue.put_nowait((stream_key(run_id), type_, json.dumps(data, default=str)))
        except queue.Full:
            self.dropped += 1
            log.warning("event=event_dropped reason=queue_full run=%s type=%s", run_id, type_)

    def heartbeat(self, name: str, info: dict[str, Any]) -> None:
        """Announce this worker (name, free pages, sessions) for the control plane's routing;
        the key expires after ``HEARTBEAT_TTL_S`` so a dead worker disappears by itself."""
        try:
            self._queue.put_nowait((HEARTBEAT_PREFIX + name, "", json.dumps(info, default=str)))
        except queue.Full:
            self.dropped += 1

    def _connect(self) -> Any:
        import redis

        if self._client is None:
            self._client = redis.Redis.from_url(self._url, socket_timeout=2, socket_connect_timeout=1)
        return self._client

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            key, type_, data = item
            if key.startswith(HEARTBEAT_PREFIX):
                self._send(key, type_, data)
                continue
            # After one event gave up, Redis counts as down: one try per event (no backlog of
            # 30 s waits) until a send succeeds again.
            give_up = time.monotonic() + (0.0 if self._redis_down else RETRY_FOR_S)
            backoff = 0.1
            while not self._send(key, type_, data):
                if time.monotonic() + backoff > give_up:
                    self.dropped += 1
                    self._redis_down = True
                    log.warning("event=event_dropped reason=redis_unreachable stream=%s type=%s", key, type_)
                    break
                time.sleep(backoff)
                backoff = min(2.0, backoff * 2)
            else:
                self.published += 1
                self._redis_down = False

    def _send(self, key: str, type_: str, data: str) -> bool:
        """One SET (heartbeat) or XADD (event); on failure drop the connection so the next
        attempt reconnects."""
        try:
            if key.startswith(HEARTBEAT_PREFIX):
                self._connect().set(key, data, ex=HEARTBEAT_TTL_S)
            else:
                self._connect().xadd(key, {"type": type_, "data": data}, maxlen=STREAM_MAXLEN, approximate=True)
            return True
        except Exception as exc:  # redis raises many types; none may reach a LIP
            self._client = None
            log.warning("event=redis_error error=%r stream=%s type=%s", exc, key, type_)
            return False

    def close(self, timeout: float = 2.0) -> None:
        """Flush what is queued (bounded by ``timeout``) and stop the thread."""
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            return
        self._thread.join(timeout)
