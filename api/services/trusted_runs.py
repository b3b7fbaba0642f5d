"""The built-in OpenAI program run in this process: no Celery hop, no sandbox start.

Why: a ``/v1/chat/completions`` request is a run of the built-in LIP
(api/builtin_lips/openai_lip.py). Through the ordinary path it pays, every time, for an
enqueue, a Celery worker picking the task up, and a gVisor container (warm or cold) importing
the SDK and connecting: hundreds of milliseconds of fixed cost that ``vllm serve`` does not
have. That program is the project's own code, and what a tenant sends it (messages, schemas,
tools) is only data to it, so the isolation the sandbox gives a tenant's *code* buys nothing
here. This module executes it in a bounded thread pool of the web process, against the local
worker's session socket, with the same SDK (``sandbox/symphony``).

Everything else is the run path of any program, called the same way: the run row is created by
``runs.create_run`` (quota, concurrency slot, plan token limit), already ``running`` on a thread
the request took for it first (:func:`reserve_thread`, :func:`start`; else queued, and
``execution.execute_run``'s ``start_run`` starts it on the thread :func:`submit` takes),
``execution.execute_started`` beats its executor heartbeat, creates the worker session with the
plan's limits, watches for a cancel (``CancelWatch`` ends the session, which stops the program
at its next call), ends the session, records the outcome and usage with ``finish_run`` (billing,
closing events) and syncs the tenant's KV files. Only the launcher differs:
:func:`launch_in_process` instead of ``sandbox.run``.

Safety rules kept here:

* Only *our* code runs in-process: the compiled source of the built-in file on disk, and only
  for a run whose program version has exactly that file's SHA-256 (a tenant may push its own
  version of its ``openai-compat`` program; such a run goes through Celery and the sandbox).
  The database's copy of the program is never executed in this process.
* Each run gets its own SDK session and its own module namespace whose ``symphony`` is a facade
  bound to that session, so concurrent runs never share a connection (the SDK's process-wide
  default session is not used).
* The worker bounds the run as it bounds a sandboxed one (tokens, deadline, KV quota): at the
  deadline it ends the session and the program's next call fails; the built-in program does
  nothing but worker calls, so it returns.
* Threads are bounded (``SYMPHONY_TRUSTED_THREADS``); past the bound a run takes the ordinary
  Celery path instead of waiting in this process's memory (where a restart would lose it). The
  ASGI event loop never runs any of this: the view waits on the run's Redis stream as before.

``SYMPHONY_TRUSTED_BUILTIN=0`` turns it off. It is also off where this process cannot reach a
worker's admin socket (``SYMPHONY_WORKER_ADMIN_SOCKET``: a web tier on hosts without a GPU
worker); the request then goes through Celery as before.
"""

from __future__ import annotations

import builtins
import copy
import functools
import hashlib
import json
import logging
import os
import sys
import threading
import time
import traceback
import types
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connection

from api.models import ProgramVersion, Run
from api.services import run_handoff
from api.services.quotas import PlanLimits
from api.services.run_args import program_args
from gpu_worker.contracts import StatusEvent
from gpu_worker.protocol import RunLimits

log = logging.getLogger(__name__)

BUILTIN_SOURCE = Path(__file__).resolve().parent.parent / "builtin_lips" / "openai_lip.py"
#: The SDK is a top-level package inside the sandbox image; here it is imported from its source.
SDK_DIR = Path(__file__).resolve().parent.parent.parent / "sandbox"
#: Exit codes as the sandbox's runner reports them (sandbox/symphony/run.py).
EXIT_OK, EXIT_PROGRAM_FAILED, EXIT_SETUP_FAILED = 0, 1, 2
MAX_ERROR_CHARS = 8000
#: How long an in-process run thread keeps its database connection for its next run.
KEEP_CONNECTION_S = 60.0

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_slots: threading.BoundedSemaphore | None = None


def _sdk() -> types.ModuleType:
    if str(SDK_DIR) not in sys.path:
        sys.path.append(str(SDK_DIR))
    import symphony

    return symphony


@functools.cache
def builtin_source() -> tuple[bytes, str]:
    """(source, SHA-256) of the built-in program's file, read once per process: every /v1
    request checks its tenant's built-in version against it, and what runs in-process is
    compiled from the same bytes."""
    source = BUILTIN_SOURCE.read_bytes()
    return source, hashlib.sha256(source).hexdigest()


@functools.cache
def _builtin_code() -> tuple[str, types.CodeType]:
    """(SHA-256, compiled code) of the built-in program's file, compiled once per process."""
    source, digest = builtin_source()
    return digest, compile(source, str(BUILTIN_SOURCE), "exec")


def available() -> bool:
    """Whether built-in runs take the in-process path here: on, and a local worker's admin
    socket is reachable from this process."""
    return bool(settings.SYMPHONY_TRUSTED_BUILTIN) and os.path.exists(settings.SYMPHONY_WORKER_ADMIN_SOCKET)


def is_builtin(version: ProgramVersion) -> bool:
    """Whether ``version`` is exactly the built-in source this process would execute."""
    return version.kind != "zip" and version.sha256 == _builtin_code()[0]


def _executor() -> tuple[ThreadPoolExecutor, threading.BoundedSemaphore]:
    global _pool, _slots
    with _lock:
        if _pool is None or _slots is None:
            threads = max(1, settings.SYMPHONY_TRUSTED_THREADS)
            _pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="trusted-run")
            _slots = threading.BoundedSemaphore(threads)
        return _pool, _slots


def submit(run: Run, plan: PlanLimits | None = None) -> None:
    """Dispatch a committed, queued run (``create_run``'s ``send``): in-process when it is the
    built-in program and a thread is free, else to Celery as usual. Never blocks on the run.
    ``plan``: the tenant's plan as the request read it, which the in-process run then uses for
    its session limits and quota notices instead of reading it twice more.

    Never queued in memory: a run waiting in this process's pool would be lost with the
    process (left ``queued``, holding its tenant's concurrency slot, with no task anywhere to
    start it). Past ``SYMPHONY_TRUSTED_THREADS`` runs at once, a run takes the ordinary path."""
    from api.services.execution import execute_run
    from api.services.runs import enqueue

    if not available() or not is_builtin(run.program_version):
        enqueue(run)
        return
    if not reserve_thread():
        log.info("run_dispatched_to_celery run=%s reason=in_process_threads_busy", run.pk)
        enqueue(run)
        return
    run_id, worker = str(run.pk), settings.SYMPHONY_WORKER_NAME
    try:
        # The executor's own ``execute_run`` with the in-process launcher (``start_run`` records
        # the worker, as for a Celery task sent to it).
        _hand_over(run_id, lambda: execute_run(run_id, target=worker, launch=launch_in_process, plan=plan))
    except BaseException:
        release_thread()
        raise
    log.info("run_dispatched_in_process run=%s tenant=%s", run.pk, run.tenant.slug)


def reserve_thread() -> bool:
    """Take one of this process's run threads for a built-in run about to be created, so that it
    can be created already running (``runs.create_run``'s ``start_on``) and handed to the
    thread with :func:`start`; False when every thread is busy. The caller gives it back with
    :func:`release_thread` unless :func:`start` was called (a run not created, or created in an
    outer transaction that may still roll back: then nothing would ever start it)."""
    return _executor()[1].acquire(blocking=False)


def release_thread() -> None:
    """Give back a thread :func:`reserve_thread` took and :func:`start` never used."""
    _executor()[1].release()


def start(run: Run, plan: PlanLimits | None = None) -> None:
    """``create_run``'s ``send`` for a committed run created running on this worker with a
    thread reserved (:func:`reserve_thread`): execute it on that thread. Why not ``submit``:
    the run's start would be a second transaction (``start_run``'s row lock, a statement and a
    commit) on the path of every answer, to move it from ``queued`` to ``running`` a few
    milliseconds after it was created. A process that dies first leaves it ``running`` without
    an executor heartbeat, and the reaper fails it (api/services/runs.py). Raising, it leaves
    the thread to its caller to give back."""
    from api.services.execution import execute_started
    from api.services.runs import publish_event

    started = copy.copy(run)  # the request that created it keeps its own instance

    def execute() -> None:
        # From its ``running`` event on, as ``execute_run`` goes on after ``start_run``.
        publish_event(str(started.pk), StatusEvent("running"))
        execute_started(started, launch=launch_in_process, plan=plan)

    _hand_over(str(run.pk), execute)
    log.info("run_started_in_process run=%s tenant=%s", run.pk, run.tenant.slug)


def _hand_over(run_id: str, execute: Callable[[], object]) -> None:
    """Give ``execute`` (the run's execution) to the pool thread reserved for it; the request
    waiting on the run takes its outcome from this process (api/services/run_handoff.py)."""
    pool, slots = _executor()
    run_handoff.expect(run_id)
    pool.submit(_on_thread, run_id, slots, execute)


def _on_thread(run_id: str, slots: threading.BoundedSemaphore, execute: Callable[[], object]) -> None:
    """What a pool thread does around its run's ``execute``: its database connection (kept for
    the next run, or handed back), a failure of the executor code itself settled, its thread
    given back."""
    close_old_connections()
    try:
        _keep_connection()
        execute()
    except Exception as exc:
        log.exception("trusted_run_failed run=%s", run_id)
        _settle(run_id, exc)
    finally:
        close_old_connections()
        slots.release()


def _keep_connection() -> None:
    """Without the web process's connection pool (``DATABASE_POOL_MAX_SIZE=0``): this thread's
    database connection, kept for its next run, which reuses it when it is under
    :data:`KEEP_CONNECTION_S` old (checked by ``close_old_connections`` at its start); an idle
    thread holds it until then. With ``CONN_MAX_AGE`` 0 each in-process run opened a connection
    or two (``close_old_connections`` before its outcome is recorded closed it again): ~10 ms
    each on the benchmark host, a large share of a short request's fixed cost. A pool thread is
    not a request thread that ends, and there are at most ``SYMPHONY_TRUSTED_THREADS`` of them,
    so this keeps a bounded number of connections; ``CONN_HEALTH_CHECKS`` still drops one that
    broke. With the pool (the default under ASGI) closing hands the connection back, cheaply,
    and an idle thread holds none."""
    if settings.DATABASE_POOL_MAX_SIZE > 0:
        return
    connection.ensure_connection()
    connection.close_at = time.monotonic() + KEEP_CONNECTION_S


def _settle(run_id: str, exc: Exception) -> None:
    """After an unexpected failure of the executor code itself: the run ends, and its stream
    gets its closing events, since the OpenAI request waits on them (a Celery task would be
    retried by the reaper; here nobody else would end it)."""
    from api.services.runs import RunOutcome, finish_run, publish_end

    try:
        close_old_connections()
        run = Run.objects.get(pk=run_id)
        if run.status not in Run.TERMINAL:
            finish_run(run_id, RunOutcome(status="failed", error=f"{type(exc).__name__}: {exc}"))
        else:
            publish_end(run)
    except Exception:
        log.exception("trusted_run_settle_failed run=%s", run_id)


def _facade(symphony: types.ModuleType, session: Any) -> types.ModuleType:
    """A ``symphony`` module whose calls all go to ``session`` (this run's own connection)."""
    facade = types.ModuleType("symphony", symphony.__doc__)
    for name in symphony.__all__:
        value = getattr(symphony, name)
        bound = getattr(session, name, None)
        if isinstance(value, types.FunctionType) and value.__module__ == "symphony" and callable(bound):
            value = bound
        setattr(facade, name, value)
    facade.session = lambda: session  # type: ignore[attr-defined]

    def set_session(_: object) -> None:
        raise RuntimeError("the built-in program's session is set by its launcher")

    facade.set_session = set_session  # type: ignore[attr-defined]
    return facade


def _load(code: types.CodeType, facade: types.ModuleType) -> types.ModuleType:
    """A fresh module of the built-in program whose ``import symphony`` gets ``facade``."""
    real_import = builtins.__import__

    def import_(name: str, globals_: Any = None, locals_: Any = None, fromlist: Any = (), level: int = 0) -> Any:
        if level == 0 and name == "symphony":
            return facade
        return real_import(name, globals_, locals_, fromlist, level)

    module = types.ModuleType("openai_lip")
    module.__dict__["__builtins__"] = {**builtins.__dict__, "__import__": import_}
    module.__dict__["__file__"] = str(BUILTIN_SOURCE)
    exec(code, module.__dict__)  # noqa: S102 - our own file's code, checked by digest (module docstring)
    return module


def _error_summary(exc: BaseException) -> str:
    """``Type: message`` and the program's own last frames, as the sandbox's runner writes it."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == str(BUILTIN_SOURCE)]
    lines = [f"{type(exc).__name__}: {exc}"]
    if frames:
        lines.append("Traceback (most recent call last):")
        lines.extend(traceback.format_list(frames[-8:]))
    return "\n".join(line.rstrip("\n") for line in lines)[:MAX_ERROR_CHARS]


def launch_in_process(run: Run, session: Any, worker_limits: RunLimits) -> Any:
    """``execution.Launch``: run the built-in program's ``main(args)`` on this thread against
    the run's worker session; a ``SandboxResult`` as the sandbox's runner would report it. A
    version that is not the built-in source falls back to the sandbox (never executed here)."""
    from api.services.execution import launch_sandbox
    from sandbox.spec import SandboxResult

    digest, code = _builtin_code()
    if run.program_version.sha256 != digest or run.program_version.kind == "zip":
        return launch_sandbox(run, session, worker_limits)
    symphony = _sdk()
    started = time.monotonic()

    def done(status: str, exit_code: int, result: Any = None, error: str | None = None) -> SandboxResult:
        out = SandboxResult(status, result, error, exit_code, duration_s=time.monotonic() - started)
        out.timings["in_process"] = 1.0
        return out

    try:
        sdk_session = symphony.connect(session.socket_path, session.token)
    except Exception as exc:
        return done("failed", EXIT_SETUP_FAILED, error=str(exc))
    try:
        try:
            result = _load(code, _facade(symphony, sdk_session)).main(program_args(run.args))
            json.dumps(result, allow_nan=False)
        except Exception as exc:
            message = _error_summary(exc)
            _finish(sdk_session, None, message)
            return done("failed", EXIT_PROGRAM_FAILED, error=message)
        refused = _finish(sdk_session, result, None)
        if refused is not None:
            return done("failed", EXIT_PROGRAM_FAILED, error=refused)
        return done("succeeded", EXIT_OK, result=result)
    finally:
        sdk_session.close()


def _finish(sdk_session: Any, result: Any, error: str | None) -> str | None:
    """The SDK's ``finish`` (as the sandbox's runner sends it); an error message if refused."""
    try:
        sdk_session.finish(result, error)
    except Exception as exc:
        return f"finish failed: {exc}"
    return None
