"""Which gpu_workers have a live Celery executor consuming their queue.

A worker's heartbeat (``symphony:worker:<name>``) says the gpu_worker process is up; it says
nothing about the Celery executor that consumes ``worker.<name>``. With only the executor dead,
runs routed to that worker waited in a queue nobody consumed until the executor was restarted by
hand. So each executor announces itself: its main process (from Celery's ``worker_ready``
signal) sets ``symphony:executor-up:<worker>:<node>`` every ``PERIOD_S`` with a ``TTL_S``
expiry, for every ``worker.<name>`` queue it consumes, and deletes it on a clean shutdown (a
drained worker leaves routing at once). A killed executor's key expires ``TTL_S`` later.

Routing (api/services/routing.py) sends runs only to a worker with both a heartbeat and a live
executor, and the reaper re-routes the runs queued on a worker that lost its executor: a queued
run of a worker whose executor died moves within ``TTL_S`` plus the reaper's period
(``REROUTE_BOUND_S``).

The value is the executor's slots (its concurrency), which load-aware routing adds up per
worker. This module is the executor's *presence*; the per-run key of
api/services/executor_liveness.py says whether one run's executor is still at work.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import defaultdict
from collections.abc import Iterable

import redis
from django.conf import settings

from api import redis_client

log = logging.getLogger(__name__)

PREFIX = "symphony:executor-up:"
TTL_S = 6
PERIOD_S = 2.0
#: How often Celery beat looks for runs queued on a worker without an executor (web/settings.py).
REAP_PERIOD_S = 5.0
#: The longest a queued run waits on a worker whose executor died before it is re-routed.
REROUTE_BOUND_S = TTL_S + REAP_PERIOD_S
QUEUE_PREFIX = "worker."


def presence_key(worker: str, node: str) -> str:
    return f"{PREFIX}{worker}:{node}"


def workers_of_queues(queues: Iterable[str]) -> list[str]:
    """The gpu_worker names an executor consuming ``queues`` serves (``worker.<name>``)."""
    return sorted({q[len(QUEUE_PREFIX) :] for q in queues if q.startswith(QUEUE_PREFIX) and len(q) > len(QUEUE_PREFIX)})


def _redis() -> redis.Redis:
    return redis_client.shared(settings.REDIS_URL)


def announce(workers: Iterable[str], node: str, slots: int) -> None:
    """One beat: this executor serves ``workers`` with ``slots`` slots, for ``TTL_S`` seconds."""
    value = json.dumps({"node": node, "slots": int(slots)})
    pipe = _redis().pipeline()
    for worker in workers:
        pipe.set(presence_key(worker, node), value, ex=TTL_S)
    pipe.execute()


def withdraw(workers: Iterable[str], node: str) -> None:
    """A clean shutdown: this executor stops serving ``workers`` now."""
    keys = [presence_key(worker, node) for worker in workers]
    if keys:
        _redis().delete(*keys)


def executor_slots_by_worker() -> dict[str, int]:
    """Slots of the live executors of each worker (absent: none live). Raises RedisError."""
    client = _redis()
    keys = list(client.scan_iter(match=PREFIX + "*", count=100))
    values = client.mget(keys) if keys else []
    slots: dict[str, int] = defaultdict(int)
    for key, value in zip(keys, values, strict=True):
        if value is None:
            continue  # expired between SCAN and MGET
        name = (key.decode() if isinstance(key, bytes) else key)[len(PREFIX) :]
        worker = name.rsplit(":", 1)[0] if ":" in name else name
        try:
            slots[worker] += max(1, int(json.loads(value).get("slots", 1)))
        except (ValueError, AttributeError, TypeError):
            slots[worker] += 1
    return dict(slots)


class Presence:
    """The executor's announcing thread: started once per executor process."""

    def __init__(self, workers: list[str], node: str, slots: int) -> None:
        self.workers, self.node, self.slots = workers, node, slots
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="executor-presence", daemon=True)

    def _beat_once(self) -> None:
        try:
            announce(self.workers, self.node, self.slots)
        except redis.RedisError as exc:  # the next beat follows in seconds
            log.warning("executor_presence_failed node=%s error=%s", self.node, exc)

    def _beat(self) -> None:
        while not self._stop.wait(PERIOD_S):
            self._beat_once()

    def start(self) -> Presence:
        self._beat_once()
        self._thread.start()
        log.info("executor_presence node=%s workers=%s slots=%d", self.node, self.workers, self.slots)
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=PERIOD_S + 2)
        try:
            withdraw(self.workers, self.node)
        except redis.RedisError:
            pass  # expires on its own


_presence: Presence | None = None


def start_presence(queues: Iterable[str], node: str, slots: int) -> Presence | None:
    """From ``worker_ready``: announce this executor for the workers of ``queues``."""
    global _presence
    workers = workers_of_queues(queues)
    if not workers or _presence is not None:
        return _presence
    _presence = Presence(workers, node, slots).start()
    return _presence


def stop_presence() -> None:
    """From ``worker_shutdown``."""
    global _presence
    if _presence is not None:
        _presence.stop()
        _presence = None
