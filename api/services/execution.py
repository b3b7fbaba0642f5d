"""Execute a queued run on this worker: gpu_worker session -> gVisor sandbox -> end session ->
finish_run. Whatever fails, finish_run is called, so status and usage are never lost."""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

import redis
from django.conf import settings
from django.db import InterfaceError, OperationalError, close_old_connections, connection

from api.models import Run
from api.services import failover, kvfiles, run_traces, trace_context, worker_start
from api.services.cancellation import CancelWatch
from api.services.executor_liveness import ExecutorHeartbeat, Rider, executor_alive
from api.services.procs import ProcessBroker
from api.services.quotas import SANDBOX_RESOURCES, PlanLimits, plan_limits, session_limits
from api.services.run_args import program_args
from api.services.runs import RunOutcome, checkpointed_usage, finish_run, start_run
from gpu_worker.protocol import RunLimits, TraceContext

log = logging.getLogger(__name__)

#: Launcher status -> run status. ``killed`` (OOM, pids) is a failure of the program.
SANDBOX_STATUS = {"succeeded": "succeeded", "failed": "failed", "timed_out": "timed_out", "killed": "failed"}


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


def _resource(limits: dict, key: str, plan_cap: int | None = None) -> int:
    """The run's own value, else the default; never past the sandbox's cap or ``plan_cap``
    (validated at creation, so this only bites when the plan was lowered since)."""
    default, cap = SANDBOX_RESOURCES[key]
    cap = min(cap, plan_cap) if plan_cap is not None else cap
    return max(1, min(int(limits.get(key) or default), cap))


def _sandbox_spec(run: Run, program_path: Path, session, worker_limits: RunLimits):
    from sandbox.spec import SandboxSpec

    return SandboxSpec(
        program_path=str(program_path),
        args=program_args(run.args),
        session_socket=session.socket_path,
        session_token=session.token,
        run_id=str(run.pk),
        tenant=run.tenant.slug,
        account=run.tenant.account_key,
        # The worker ends the session at the same deadline; the container gets a little
        # longer so a LIP can report the worker's ETIMEDOUT as its own error (the kill's
        # message still names the deadline the user set).
        deadline_s=worker_limits["deadline_s"],
        grace_s=5,
        memory_mb=_resource(run.limits, "memory_mb", plan_limits(run.tenant).max_memory_mb),
        pids=_resource(run.limits, "pids"),
        output_limit_bytes=_resource(run.limits, "output_limit_bytes"),
        image=settings.SYMPHONY_SANDBOX_IMAGE or None,
        entry=run.entry,
    )


class _NotStarted(Exception):
    """The worker refused the admin connection before the run's session existed."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _end_session(watch: CancelWatch) -> tuple[dict, dict, str]:
    """The worker's usage and trace of the session, or ``(checkpointed usage, {}, why)`` when
    the worker is gone (then the runs queued on it are re-routed now, not at its heartbeat's
    expiry)."""
    try:
        ended = watch.end_session()
        return dict(ended.usage), dict(ended.trace or {}), ""
    except Exception as exc:
        name = settings.SYMPHONY_WORKER_NAME
        if failover.is_unreachable(exc):
            failover.worker_lost(name, exc)
        # Billed for what the session used up to the worker's last checkpoint of it.
        usage = checkpointed_usage(watch.run_id)
        return usage, {}, f"gpu_worker {name!r} became unreachable during the run ({type(exc).__name__}: {exc})"


def _mark_program(marks: run_traces.ExecutorMarks, result: Any, launch: Launch) -> None:
    """The program's start (a warm slot or a fresh container) and run, for the run's trace."""
    marks.sandbox_start_s = float(getattr(result, "start_s", 0.0) or 0.0)
    marks.sandbox_run_s = float(getattr(result, "duration_s", 0.0) or 0.0)
    if launch is launch_sandbox:
        marks.warm = bool(getattr(result, "timings", {}).get("warm"))


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


def _record_outcome(run_id: str, outcome: RunOutcome, plan: PlanLimits | None = None) -> str:
    """finish_run, surviving a dropped database connection (restart, failover, idle kill during
    a long run): the connection is health-checked first and re-opened on failure, so the result
    and the usage are written instead of being lost with the task."""
    attempt = 1
    while True:
        close_old_connections()  # with CONN_HEALTH_CHECKS the next query first checks the link
        try:
            return finish_run(run_id, outcome, plan).status
        except (OperationalError, InterfaceError) as exc:
            if attempt == RECORD_ATTEMPTS:
                raise
            log.warning("finish_run_retry run=%s attempt=%d error=%s", run_id, attempt, exc)
            connection.close()
            time.sleep(min(8.0, 0.5 * 2**attempt))
            attempt += 1


def execute_run(
    run_id: str,
    target: str | None = None,
    attempt: int = 0,
    launch: Launch | None = None,
    riders: Sequence[Rider] = (),
    plan: PlanLimits | None = None,
) -> str:
    """``target``: the worker the task was sent to (None: any, for tasks sent before re-routing
    existed); ``attempt``: how many times the run was re-routed (api/services/failover.py);
    ``launch``: how the program runs (default: the sandbox); ``riders``: keys refreshed with the
    run's executor heartbeat (its slot lease); ``plan``: the tenant's plan as the request that
    created the run read it (an in-process run's; read here when not given)."""
    # A worker still loading its model is not dead: the run waits for it, still queued.
    worker_start.wait_for_start(run_id, settings.SYMPHONY_WORKER_NAME, settings.SYMPHONY_WORKER_ADMIN_SOCKET)
    run = start_run(run_id, settings.SYMPHONY_WORKER_NAME, target)
    if run is None:
        return _handle_redelivery(run_id)
    return execute_started(run, attempt, launch, riders, plan)


def execute_started(
    run: Run,
    attempt: int = 0,
    launch: Launch | None = None,
    riders: Sequence[Rider] = (),
    plan: PlanLimits | None = None,
) -> str:
    """Execute ``run``, already ``running`` on this worker: started by :func:`execute_run`, or
    created so by the one that holds this thread (``runs.create_run``'s ``start_on``). Its
    executor heartbeat starts now (a run created running that never gets here is reaped as one
    whose executor died). Arguments as :func:`execute_run`'s."""
    with ExecutorHeartbeat(str(run.pk), riders):
        try:
            return _execute(run, launch or launch_sandbox, plan)
        except _NotStarted as lost:
            return failover.reroute_unstarted(str(run.pk), settings.SYMPHONY_WORKER_NAME, lost.cause, attempt)


def _create_session(
    client, tenant: str, run_id: str, worker_limits: RunLimits, tree: str, trace: TraceContext | None = None
):
    """``create_session``; a worker that is not there at all raises :class:`_NotStarted`.
    ``tree``: the root run of the run's tree, whose channels it shares (gpu_worker/channels.py);
    ``trace``: the run's trace context, which the worker's engine spans link to."""
    try:
        return client.create_session(tenant, run_id, worker_limits, tree=tree, trace=trace)
    except Exception as exc:
        if failover.is_unreachable(exc):
            raise _NotStarted(exc) from exc
        raise


def _tree_root(run: Run) -> str:
    """The id of the root of ``run``'s run tree (itself when nothing spawned it): a few
    queries at most, the plan bounds the tree's depth."""
    root = run
    while root.parent_id is not None:
        root = Run.objects.only("pk", "parent_id").get(pk=root.parent_id)
    return str(root.pk)


#: How a run's program is executed once its worker session exists: ``(run, session access,
#: worker limits) -> SandboxResult``. The default is the gVisor sandbox; the built-in OpenAI
#: program has a trusted in-process launcher (api/services/trusted_runs.py).
Launch = Callable[[Run, Any, RunLimits], Any]


def launch_sandbox(run: Run, session: Any, worker_limits: RunLimits) -> Any:
    """Run the program in a gVisor sandbox (a warm slot when one fits, else a fresh container)."""
    import sandbox

    version = run.program_version
    with tempfile.TemporaryDirectory(prefix="symphony-run-") as tmp:
        program_path = Path(tmp) / ("program.zip" if version.kind == "zip" else "program.py")
        program_path.write_bytes(bytes(version.content))
        return sandbox.run(_sandbox_spec(run, program_path, session, worker_limits))


def _names_kv_files(run: Run, launch: Launch) -> bool:
    """Whether the run may have created, written or removed a named KV file, which the control
    plane's mirror (api/services/kvfiles.py) then has to learn from the worker. Any sandboxed
    program may; the built-in program (the only one run in-process: trusted_runs launches it only
    after checking its source) names one only for a
    Responses conversation (its ``conversation`` argument), so a chat request pays for no
    ``kv_list`` and no mirror update."""
    if launch is launch_sandbox:
        return True
    return "conversation" in program_args(run.args)


def _execute(run: Run, launch: Launch = launch_sandbox, plan: PlanLimits | None = None) -> str:
    tenant = run.tenant.slug
    try:
        from gpu_worker.admin_client import AdminClient

        client = AdminClient(settings.SYMPHONY_WORKER_ADMIN_SOCKET, timeout=30)
        # A sandboxed program may spawn: this executor serves its spawns (ProcessBroker below).
        # The built-in program run in-process never does, and pays for no broker.
        spawns = launch is launch_sandbox
        # The month's tokens as start_run read them with the run (a run from elsewhere: read here).
        worker_limits = session_limits(run, plan, getattr(run, "month_tokens", None))
        if spawns:
            worker_limits["spawn"] = True
        # The runs of one tree (a root and what it spawned) share channels on the worker.
        marks = run_traces.ExecutorMarks()
        began = time.time()
        trace = trace_context.run_context(run.pk, run.traceparent)
        session = _create_session(client, tenant, str(run.pk), worker_limits, tree=_tree_root(run), trace=trace)
        marks.session_created = (began, time.time())
        # Ends the session early if the run is cancelled meanwhile (api/services/cancellation.py).
        watch = CancelWatch(str(run.pk), lambda: client.end_session(session.session_id))
        # Serves the LIP's spawns and runs its children here; cancels those still live when the
        # run ends, before its outcome is recorded (api/services/procs.py).
        broker = ProcessBroker(str(run.pk), worker_limits["deadline_s"], execute_run) if spawns else nullcontext()
        with watch, broker:
            try:
                marks.launched_at = time.time()
                result = launch(run, session, worker_limits)
            finally:
                ending = time.time()
                usage, worker_trace, worker_error = _end_session(watch)
                marks.session_ended = (ending, time.time())
        _mark_program(marks, result, launch)
        outcome = replace(_outcome(result, usage, worker_error), trace=run_traces.recorded(marks, worker_trace))
        if watch.cancelled.is_set():
            said = f" (the program then reported: {outcome.error})" if outcome.error else ""
            outcome = replace(
                outcome, status="cancelled", error=f"cancelled while running; the program was stopped{said}"
            )
    except _NotStarted:
        raise
    except Exception as exc:
        log.exception("run_failed run=%s tenant=%s", run.pk, tenant)
        outcome = RunOutcome(status="failed", error=f"{type(exc).__name__}: {exc}")
    status = _record_outcome(str(run.pk), outcome, plan)
    if _names_kv_files(run, launch):
        try:
            kvfiles.sync_worker(run.tenant, settings.SYMPHONY_WORKER_NAME)  # this executor's worker
        except kvfiles.WorkerUnavailable:
            log.warning("kv_sync_skipped run=%s tenant=%s", run.pk, tenant)
    return status
