"""Runs wait for a gpu_worker that is starting instead of failing over as if it had died.

An executor that finds no admin socket for its worker used to take it for dead: the run was
re-routed (three times at most, seconds apart) and then failed, so every run and every ``/v1``
request sent while a fresh ``make up`` loaded and compiled the model (minutes, the first time
on a machine) failed. A starting worker says so in Redis (``gpu_worker/start_beacon.py``,
contracts' ``starting_key``); while it does, the executor holds the run, still ``queued``, until
the socket appears, the run stops being queued (cancelled) or ``SYMPHONY_WORKER_START_WAIT_S``
pass. A worker that is not starting and not there is dead as before (api/services/failover.py).
"""

from __future__ import annotations

import logging
import os
import time

import redis
from django.conf import settings

from api import redis_client
from api.models import Run
from gpu_worker import contracts
from gpu_worker.contracts import StatusEvent

log = logging.getLogger(__name__)

#: Seconds between looks at the admin socket while the worker starts.
POLL_S = 0.5
#: Seconds between looks at whether the waiting run is still queued (a cancel ends the wait).
RUN_CHECK_S = 2.0


def starting_since(worker: str) -> float | None:
    """The Unix time ``worker`` began starting, while it says it is starting; else ``None``
    (ready, dead, or Redis unreadable: then the failover decides, as before)."""
    try:
        value = redis_client.shared(settings.REDIS_URL).get(contracts.starting_key(worker))
    except redis.RedisError:
        return None
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        return time.time()


def wait_for_start(run_id: str, worker: str, admin_socket: str) -> None:
    """Return once ``worker``'s admin socket exists, or it is not starting (any more), or the
    run is no longer queued, or ``SYMPHONY_WORKER_START_WAIT_S`` passed; what follows (starting
    the run, failing over) is the caller's as ever. One ``stat`` when the worker is up."""
    if os.path.exists(admin_socket):
        return
    since = starting_since(worker)
    if since is None:
        return
    began = time.monotonic()
    bound = settings.SYMPHONY_WORKER_START_WAIT_S
    log.info("run_waits_for_worker_start run=%s worker=%s starting_for_s=%.0f", run_id, worker, time.time() - since)
    _say_why(run_id, worker)
    next_run_check = began + RUN_CHECK_S
    while not os.path.exists(admin_socket):
        now = time.monotonic()
        if now - began > bound:
            log.warning("worker_start_wait_over run=%s worker=%s waited_s=%.0f", run_id, worker, now - began)
            return
        if now >= next_run_check:
            next_run_check = now + RUN_CHECK_S
            if starting_since(worker) is None:
                return  # it stopped starting without answering: it died; the failover decides
            if not Run.objects.filter(pk=run_id, status="queued").exists():
                return
        time.sleep(POLL_S)
    log.info("run_worker_started run=%s worker=%s waited_s=%.1f", run_id, worker, time.monotonic() - began)


def _say_why(run_id: str, worker: str) -> None:
    """Tell whoever follows the run why it stays queued (a ``status`` event with a ``reason``, as
    a re-routed run gets): a fresh stack's first start takes minutes."""
    from api.services.runs import publish_event

    reason = f"waiting for gpu_worker {worker!r} to finish starting (loading the model)"
    try:
        publish_event(run_id, StatusEvent("queued", reason=reason))
    except redis.RedisError as exc:  # the wait goes on; only the note is lost
        log.warning("run_wait_reason_unpublished run=%s error=%s", run_id, exc)
