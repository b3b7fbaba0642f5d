"""Failover of runs whose gpu_worker is gone, decided by the executor the moment it notices.

A run whose worker refused the admin connection before its session existed has not run
anything: it goes back to ``queued`` and to a live worker (at most ``MAX_REROUTES`` times, then
it fails with an error naming every worker tried). The dead worker is taken out of routing at
once (:func:`api.services.routing.mark_unavailable`) and the other runs queued on it move too,
so a death costs queued runs seconds, not the heartbeat's expiry. A run whose session had
started fails naming the lost worker and is billed for what ran (api/services/execution.py).
"""

from __future__ import annotations

import logging

from api.models import Run, UsageRecord
from api.services import routing
from api.services.runs import RunOutcome, _enqueue, finish_run, return_to_queue

log = logging.getLogger(__name__)

#: Re-routes of one run before it fails: each one follows a worker that refused it.
MAX_REROUTES = 3
#: Seconds before the n-th re-routed task is delivered (``REROUTE_DELAY_S * 2**n``): with no
#: other live worker, a worker that is merely restarting gets a moment to come back.
REROUTE_DELAY_S = 0.5

#: What an admin-socket connect raises when nothing listens: the socket file is gone
#: (FileNotFoundError), nobody accepts (ConnectionRefusedError), or the worker died mid-reply.
UNREACHABLE = (ConnectionRefusedError, FileNotFoundError, ConnectionResetError, BrokenPipeError)


def is_unreachable(exc: BaseException) -> bool:
    """The worker is not there (as opposed to answering with an error or being slow)."""
    return isinstance(exc, UNREACHABLE)


def worker_lost(worker: str, exc: BaseException) -> int:
    """Take ``worker`` out of routing and move the runs queued on it; returns how many moved."""
    routing.mark_unavailable(worker, f"{type(exc).__name__}: {exc}")
    moved = 0
    for run in Run.objects.filter(status="queued", worker=worker).select_related("tenant"):
        _enqueue(run, exclude=frozenset({worker}))
        moved += 1
    if moved:
        log.warning("queued_runs_rerouted worker=%s runs=%d", worker, moved)
    return moved


def reroute_unstarted(run_id: str, worker: str, exc: BaseException, attempt: int) -> str:
    """The run's session was never created on ``worker``: re-route it, or fail it once it has
    been refused ``MAX_REROUTES`` times. Returns the run's status afterwards."""
    worker_lost(worker, exc)
    run = return_to_queue(run_id, worker)
    if run is None:
        # Cancelled (or reaped) meanwhile: recorded like any run that ended before its session
        # existed, so it has its (zero) usage row and a purge waiting on it is not held up.
        if not UsageRecord.objects.filter(run_id=run_id).exists():
            error = f"gpu_worker {worker!r} was unreachable before the run started"
            finish_run(run_id, RunOutcome(status="failed", error=error))
        return "skipped"
    if attempt >= MAX_REROUTES:
        error = (
            f"no gpu_worker could take the run: it was re-routed {attempt} times and the last worker "
            f"tried, {worker!r}, was unreachable before the run started ({type(exc).__name__}: {exc})"
        )
        return finish_run(run_id, RunOutcome(status="failed", error=error)).status
    target = _enqueue(run, attempt=attempt + 1, exclude=frozenset({worker}), countdown=REROUTE_DELAY_S * 2**attempt)
    log.warning("run_rerouted run=%s from=%s to=%s attempt=%d", run_id, worker, target, attempt + 1)
    return "rerouted"
