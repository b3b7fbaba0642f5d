"""Execute a queued run on this worker: gpu_worker session -> gVisor sandbox -> end session ->
finish_run. Whatever fails, finish_run is called, so status and usage are never lost."""

from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import redis
from django.conf import settings
from django.db import InterfaceError, OperationalError, close_old_connections, connection

from api.models import Run
from api.services import kvfiles
from api.services.cancellation import CancelWatch
from api.services.executor_liveness import ExecutorHeartbeat, executor_alive
from api.services.quotas import session_limits
from api.services.runs import RunOutcome, finish_run, start_run

log = logging.getLogger(__name__)

#: Launcher status -> run status. ``killed`` (OOM, pids) is a failure of the program.
SANDBOX_STATUS = {"succeeded": "succeeded", "failed": "failed", "timed_out": "timed_out", "killed": "failed"}
#: Sandbox resources a run may ask for in its limits, with their defaults and upper bounds.
SANDBOX_RESOURCES = {
    "memory_mb": (512, 4096),
    "pids": (128, 1024),
    "output_limit_bytes": (1 << 20, 16 << 20),
}


def _handle_redelivery(run_id: str) -> str:
    """The task arrived for a run that is not queued. Tasks are acked late, so a run still
    "running" here was started by an executor that died (the broker redelivered its task):
    fail it with a clear error instead of leaving it running forever. Unless its executor is still
    heartbeating: then the broker redelivered a task that is still executing (a run longer than
    the visibility timeout), and the run is left to it."""
    try:
        alive = executor_alive(run_id)
    except redis.RedisError:
        alive = True  # no evidence either way: the reaper decides once Redis answers
    if alive:
        log.warning("redelivery_ignored run=%s reason=executor_alive_or_unknown", run_id)
        return "skipped"
    if Run.objects.filter(pk=run_id, status="running").exists():
        error = "the worker executing this run died before it finished (task redelivered)"
        return finish_run(run_id, RunOutcome(status="failed", error=error)).status
    return "skipped"


def _resource(limits: dict, key: str) -> int:
    default, cap = SANDBOX_RESOURCES[key]
    return max(1, min(int(limits.get(key) or default), cap))


def _sandbox_spec(run: Run, program_path: Path, session, worker_limits: dict):
    from sandbox.launcher import SandboxSpec

    return SandboxSpec(
        program_path=str(program_path),
        args=run.args,
        session_socket=session.socket_path,
        session_token=session.token,
        run_id=str(run.pk),
        tenant=run.tenant.slug,
        # The worker ends the session at the same deadline; the container gets a little
        # longer so a LIP can report the worker's ETIMEDOUT as its own error.
        deadline_s=worker_limits["deadline_s"] + 5,
        memory_mb=_resource(run.limits, "memory_mb"),
        pids=_resource(run.limits, "pids"),
        output_limit_bytes=_resource(run.limits, "output_limit_bytes"),
        image=settings.SYMPHONY_SANDBOX_IMAGE or None,
    )


def _end_session(watch: CancelWatch) -> tuple[dict, str]:
    """The worker's usage for the session, or ``({}, why)`` when the worker is gone."""
    try:
        return dict(watch.end_session().usage), ""
    except Exception as exc:
        name = settings.SYMPHONY_WORKER_NAME
        return {}, f"gpu_worker {name!r} became unreachable during the run ({type(exc).__name__}: {exc})"


def _outcome(result, usage: dict, worker_error: str) -> RunOutcome:
    """Map the sandbox result; a lost worker fails the run whatever the LIP reported."""
    usage = {**usage, "sandbox_seconds": result.duration_s}
    if worker_error:
        lip_error = f"; the program reported: {result.error}" if result.error else ""
        error, status = worker_error + lip_error, "failed"
    else:
        error, status = result.error or "", SANDBOX_STATUS.get(result.status, "failed")
    return RunOutcome(status, result.result, error, result.exit_code, usage, result.stdout, result.stderr)


#: Attempts at recording a run's outcome when the database connection fails under it.
RECORD_ATTEMPTS = 5


def _record_outcome(run_id: str, outcome: RunOutcome) -> str:
    """finish_run, surviving a dropped database connection (restart, failover, idle kill during
    a long run): the connection is health-checked first and re-opened on failure, so the result
    and the usage are written instead of being lost with the task."""
    attempt = 1
    while True:
        close_old_connections()  # with CONN_HEALTH_CHECKS the next query first checks the link
        try:
            return finish_run(run_id, outcome).status
        except (OperationalError, InterfaceError) as exc:
            if attempt == RECORD_ATTEMPTS:
                raise
            log.warning("finish_run_retry run=%s attempt=%d error=%s", run_id, attempt, exc)
            connection.close()
            time.sleep(min(8.0, 0.5 * 2**attempt))
            attempt += 1


def execute_run(run_id: str) -> str:
    run = start_run(run_id, settings.SYMPHONY_WORKER_NAME)
    if run is None:
        return _handle_redelivery(run_id)
    with ExecutorHeartbeat(run_id):
        return _execute(run)


def _execute(run: Run) -> str:
    tenant = run.tenant.slug
    try:
        from gpu_worker.admin_client import AdminClient
        from sandbox.launcher import SandboxLauncher
        from sandbox.pool import shared_pool

        client = AdminClient(settings.SYMPHONY_WORKER_ADMIN_SOCKET, timeout=30)
        worker_limits = session_limits(run)
        session = client.create_session(tenant, str(run.pk), worker_limits)
        version = run.program_version
        # Ends the session early if the run is cancelled meanwhile (api/services/cancellation.py).
        watch = CancelWatch(str(run.pk), lambda: client.end_session(session.session_id))
        with watch, tempfile.TemporaryDirectory(prefix="symphony-run-") as tmp:
            program_path = Path(tmp) / ("program.zip" if version.kind == "zip" else "program.py")
            program_path.write_bytes(bytes(version.content))
            try:
                spec = _sandbox_spec(run, program_path, session, worker_limits)
                # Warm pool (SYMPHONY_SANDBOX_POOL_SIZE > 0) when it has a slot with these limits;
                # otherwise, or when it declines the run, the cold path as before.
                pool = shared_pool(settings.SYMPHONY_SANDBOX_IMAGE or None)
                result = (pool.run(spec) if pool is not None else None) or SandboxLauncher().run(spec)
            finally:
                usage, worker_error = _end_session(watch)
        outcome = _outcome(result, usage, worker_error)
        if watch.cancelled.is_set():
            said = f" (the program then reported: {outcome.error})" if outcome.error else ""
            outcome = replace(
                outcome, status="cancelled", error=f"cancelled while running; the program was stopped{said}"
            )
    except Exception as exc:
        log.exception("run_failed run=%s tenant=%s", run.pk, tenant)
        outcome = RunOutcome(status="failed", error=f"{type(exc).__name__}: {exc}")
    status = _record_outcome(str(run.pk), outcome)
    try:
        kvfiles.sync(run.tenant)
    except kvfiles.WorkerUnavailable:
        log.warning("kv_sync_skipped run=%s tenant=%s", run.pk, tenant)
    return status
