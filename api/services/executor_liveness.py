"""Liveness of the Celery executor of each running run, so a dead executor is noticed quickly.

A Celery worker process killed mid-run (OOM, SIGKILL, host loss) leaves its run ``running``: the
gpu_worker is alive and heartbeating, so worker liveness says nothing, and with ``acks_late`` the
broker redelivers the task only after its visibility timeout (an hour on Redis). While it runs a
run, the executor therefore refreshes ``symphony:executor:<run_id>`` (TTL ``TTL_S``) every
``PERIOD_S``. The reaper fails running runs whose key is gone; a redelivered task whose key is
still fresh leaves the run alone (its first executor is still at work, e.g. a run longer than the
visibility timeout), so a run never executes twice and never stays stuck.
"""

from __future__ import annotations

import logging
import threading

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


class ExecutorHeartbeat:
    """``with ExecutorHeartbeat(run_id):`` around the execution of one run."""

    def __init__(self, run_id: str) -> None:
        self.run_id = str(run_id)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"executor-heartbeat-{run_id}", daemon=True)

    def _beat_once(self) -> None:
        try:
            _redis().set(_key(self.run_id), "1", ex=TTL_S)
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
