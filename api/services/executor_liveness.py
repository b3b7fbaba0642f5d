"""Liveness of the Celery executor of each running run, so a dead executor is noticed quickly.

A Celery worker process killed mid-run (OOM, SIGKILL, host loss) leaves its run ``running``: the
gpu_worker is alive and heartbeating, so worker liveness says nothing, and with ``acks_late`` the
broker redelivers the task only after its visibility timeout (an hour on Redis). While it runs a
run, the executor therefore refreshes ``symphony:executor:<run_id>`` (TTL ``TTL_S``) every
``PERIOD_S``. The reaper fails running runs whose key is gone; a redelivered task whose key is
still fresh leaves the run alone (its first executor is still at work, e.g. a run longer than the
visibility timeout), so a run never executes twice and never stays stuck.

The same beat refreshes whatever else lives only as long as the run executes (its executor slot
lease, api/services/executor_slots.py): one thread and one Redis round trip per run every
``PERIOD_S``, not one thread per key.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Protocol

import redis
from django.conf import settings

from api import redis_client

log = logging.getLogger(__name__)

TTL_S = 15
PERIOD_S = 5.0


def _key(run_id: str) -> str:
    return f"symphony:executor:{run_id}"


def _redis() -> redis.Redis:
    # The process's pooled client: a connection per beat cost a TCP set-up on every run's start
    # and end, on the path of every request's latency (B11's 1-token figure).
    return redis_client.shared(settings.REDIS_URL)


class Rider(Protocol):
    """A Redis key that lives as long as the run executes and is refreshed with its heartbeat."""

    def refresh(self, pipe: redis.client.Pipeline) -> None:
        """Queue the commands that refresh it on ``pipe`` (sent with the heartbeat's)."""


class ExecutorHeartbeat:
    """``with ExecutorHeartbeat(run_id, riders):`` around the execution of one run; ``riders``
    are refreshed by the same thread in the same round trip."""

    def __init__(self, run_id: str, riders: Sequence[Rider] = ()) -> None:
        self.run_id = str(run_id)
        self.riders = tuple(riders)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"executor-heartbeat-{run_id}", daemon=True)

    def _beat_once(self) -> None:
        try:
            pipe = _redis().pipeline(transaction=False)
            pipe.set(_key(self.run_id), "1", ex=TTL_S)
            for rider in self.riders:
                rider.refresh(pipe)
            pipe.execute()
        except redis.RedisError as exc:  # a Redis hiccup must not fail the run itself
            log.warning("executor_heartbeat_failed run=%s error=%s", self.run_id, exc)

    def _beat(self) -> None:
        while not self._stop.wait(PERIOD_S):
            self._beat_once()

    def __enter__(self) -> ExecutorHeartbeat:
        self._beat_once()  # the key exists as soon as the run is being executed
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=PERIOD_S + 5)
        try:
            _redis().delete(_key(self.run_id))
        except redis.RedisError:
            pass  # expires on its own


def executor_alive(run_id: str) -> bool:
    """Whether an executor refreshed this run's key within ``TTL_S``. Raises RedisError when
    Redis cannot be read: callers must not act on no evidence."""
    return bool(_redis().exists(_key(str(run_id))))
