"""Stopping a run's program when the run is cancelled while it executes.

Cancelling marks the row (api/services/runs.py), but the program runs in a sandbox on a worker
host the web process cannot reach. So the cancel also sets ``symphony:cancel:<run_id>`` in Redis,
and the executor running the run watches for it (:class:`CancelWatch`): on the flag it ends the
run's worker session. That fails the program's waiting and later system calls (its socket
closes), so a LIP, whose work is system calls, stops within one of them, and the worker stops
metering it. A program that computes without calling the worker runs on to its deadline.

The session is ended once, by whichever comes first, the watch or the executor's own ending of the
session after the program exits (:meth:`CancelWatch.end_session`): the worker reports the
session's usage only once, and it must be billed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

import redis
from django.conf import settings

from api import redis_client

log = logging.getLogger(__name__)

#: How long the flag outlives the cancel (a run is executing by then, or never will).
FLAG_TTL_S = 24 * 3600
#: How often an executing run's flag is read (one Redis GET per running run per period).
POLL_S = 0.5

T = TypeVar("T")


def _key(run_id: str) -> str:
    return f"symphony:cancel:{run_id}"


def _redis() -> redis.Redis:
    return redis_client.shared(settings.REDIS_URL)


def request_stop(run_id: str) -> bool:
    """Ask the executor of ``run_id`` to stop its program; False when Redis could not be told
    (the run is cancelled all the same, and its program runs to its end or deadline)."""
    try:
        _redis().set(_key(str(run_id)), "1", ex=FLAG_TTL_S)
        return True
    except redis.RedisError as exc:
        log.warning("cancel_flag_failed run=%s error=%s", run_id, exc)
        return False


def stop_requested(run_id: str, client: redis.Redis | None = None) -> bool:
    return bool((client or _redis()).exists(_key(str(run_id))))


class CancelWatch(Generic[T]):
    """``with CancelWatch(run_id, end_session) as watch:`` around a run's sandbox; after it,
    ``watch.end_session()`` ends the session (or returns what the watch's ending got)."""

    def __init__(self, run_id: str, end_session: Callable[[], T]) -> None:
        self.run_id = str(run_id)
        self._end = end_session
        self._lock = threading.Lock()
        self._ended: tuple[T | None, BaseException | None] | None = None
        self._stop = threading.Event()
        #: Set when the session was ended because the run was cancelled.
        self.cancelled = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=f"cancel-watch-{run_id}", daemon=True)

    def end_session(self) -> T:
        """End the session once; every later call returns (or raises) what that one did."""
        with self._lock:
            if self._ended is None:
                try:
                    self._ended = (self._end(), None)
                except Exception as exc:
                    self._ended = (None, exc)
            value, error = self._ended
        if error is not None:
            raise error
        return value  # type: ignore[return-value]

    def _watch(self) -> None:
        # The process's shared client (api/redis_client.py): each poll borrows a pooled connection.
        # It is never closed here: closing it disconnects every pooled connection, including
        # those other threads are using at that moment (several runs per process: a Celery
        # thread pool, a run tree's executors, the web process's in-process runs), whose commands then fail with EBADF.
        client = _redis()
        while not self._stop.wait(POLL_S):
            try:
                if not stop_requested(self.run_id, client):
                    continue
            except redis.RedisError as exc:  # a Redis hiccup must not fail the run
                log.warning("cancel_watch_failed run=%s error=%s", self.run_id, exc)
                continue
            log.info("run_cancel_stopping run=%s", self.run_id)
            self.cancelled.set()
            try:
                self.end_session()
            except Exception as exc:  # the executor's own call reports it
                log.warning("cancel_end_session_failed run=%s error=%s", self.run_id, exc)
            break

    def __enter__(self) -> CancelWatch[T]:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=POLL_S + 10)
