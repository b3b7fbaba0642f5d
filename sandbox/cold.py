"""The cold path: one fresh gVisor container per run (docs/ARCHITECTURE.md §7).

The container gets: runtime ``runsc``, no network, read-only root, a small ``/tmp`` tmpfs, no
capabilities, ``no-new-privileges``, pids/memory/CPU limits, a non-root user, and exactly two
mounts: the run's staging dir (program + args, read-only) and the session socket
(:meth:`~sandbox.containers.SandboxHost.container_config`). The wall-clock deadline and the output
cap are enforced by killing the container. The container and the staging dir are removed on
every path; containers left by a crashed launcher are found by label and removed by
:func:`sandbox.reaper.reap`.
"""

from __future__ import annotations

import logging
import queue
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from sandbox.containers import OutputWatch, SandboxHost, container_state
from sandbox.outcome import finish_result
from sandbox.spec import (
    LABEL_EXPIRES,
    LABEL_RUN,
    LABEL_TENANT,
    LIP_DIR,
    REAP_GRACE_S,
    SOCKET_IN_SANDBOX,
    SandboxResult,
    SandboxSpec,
)
from sandbox.staging import stage_program

log = logging.getLogger(__name__)

#: The runner's exit statuses (``symphony.run.EXIT_*``; checked by a test: the host does not
#: import the SDK): what a run that ended at its record would have exited with.
RUNNER_EXIT_OK, RUNNER_EXIT_PROGRAM_FAILED, RUNNER_EXIT_SETUP_FAILED = 0, 1, 2
#: How long a launcher's background remover thread waits for more work before it ends.
REMOVER_IDLE_S = 5.0


def _stage(spec: SandboxSpec) -> tuple[Path, str]:
    """Stage program + args in a fresh dir readable by the sandbox user; returns (dir, program)."""
    staging = Path(tempfile.mkdtemp(prefix="symphony-lip-"))
    try:
        staging.chmod(0o755)
        name = stage_program(spec, staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return staging, name


class SandboxLauncher(SandboxHost):
    """Runs LIPs in fresh gVisor containers. Thread-safe: one ``run`` per calling thread."""

    def __init__(self, client: Any = None, image: str | None = None, runtime: str = "runsc") -> None:
        super().__init__(client, image, runtime)
        #: Containers of runs that ended at their record, removed off the caller's clock
        #: (a force-remove waits out gVisor's teardown, ~0.1 s); see :meth:`_remove_later`.
        self._removals: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._remover: threading.Thread | None = None
        self._remover_lock = threading.Lock()

    def _create(self, spec: SandboxSpec, tag: str, staging: Path, program: str):
        from docker.types import Mount

        config = self.container_config(
            spec.limits,
            tag,
            command=["python3", "-I", "-B", "-m", "symphony.run", f"{LIP_DIR}/{program}"],
            environment={
                "SYMPHONY_SOCKET": SOCKET_IN_SANDBOX,
                "SYMPHONY_TOKEN": spec.session_token,
                "SYMPHONY_ARGS_FILE": f"{LIP_DIR}/args.json",
                "SYMPHONY_RUN_ID": spec.run_id,
            },
            mounts=[
                Mount(LIP_DIR, str(staging), type="bind", read_only=True),
                Mount(SOCKET_IN_SANDBOX, str(spec.session_socket), type="bind", read_only=False),
            ],
            labels={
                LABEL_RUN: str(spec.run_id)[:200],
                LABEL_TENANT: str(spec.tenant)[:200],
                LABEL_EXPIRES: str(int(time.time() + spec.kill_after_s + REAP_GRACE_S)),
            },
            account=spec.account,
        )
        return self.create(**config)

    def run(self, spec: SandboxSpec) -> SandboxResult:
        """Run to completion (or deadline); never leaves the container or staging dir behind."""
        t0 = time.monotonic()
        if not Path(spec.session_socket).exists():
            raise FileNotFoundError(f"session socket {spec.session_socket} does not exist")
        tag = self.image_for(spec.limits)
        staging, program = _stage(spec)
        container = None
        by_record = False
        try:
            container = self._create(spec, tag, staging, program)
            res, by_record = self._run_container(spec, container, t0)
            return res
        finally:
            if container is not None:
                if by_record:  # the program is done; gVisor's teardown need not be waited out
                    self._remove_later(container)
                else:
                    self.remove(container)
            shutil.rmtree(staging, ignore_errors=True)

    def _remove_later(self, container: Any) -> None:
        """Remove ``container`` on this launcher's remover thread. The run is over (its record
        is in); if the process dies first, :func:`sandbox.reaper.reap` removes the container once expired."""
        with self._remover_lock:
            self._removals.put(container)
            if self._remover is None:
                self._remover = threading.Thread(target=self._removal_loop, name="sandbox-remover", daemon=True)
                self._remover.start()

    def _removal_loop(self) -> None:
        """Removes queued containers; ends after ``REMOVER_IDLE_S`` with nothing queued, so a
        launcher made per run (the Celery executor's cold path) leaves no thread behind."""
        while True:
            try:
                container = self._removals.get(timeout=REMOVER_IDLE_S)
            except queue.Empty:
                with self._remover_lock:
                    if self._removals.empty():
                        self._remover = None
                        return
                continue
            self.remove(container)

    def _run_container(self, spec: SandboxSpec, container: Any, t0: float) -> tuple[SandboxResult, bool]:
        """The result, and whether the run ended at its record (see :meth:`_wait_for_end`)."""
        watch = self.watch(container, spec.output_limit_bytes)
        container.start()
        started = time.monotonic()
        exit_code, by_record = self._wait_for_end(container, watch, started + spec.kill_after_s)
        ended = time.monotonic()
        watch.close(join_s=0 if by_record else 10.0)
        res = SandboxResult(
            status="failed",
            start_s=started - t0,
            duration_s=ended - started,
            container=container.name,
            timings={"create_and_start_s": started - t0, "run_s": ended - started},
        )
        finish_result(res, spec, watch, exit_code, {} if by_record else container_state(container))
        return res, by_record

    def _wait_for_end(self, container: Any, watch: OutputWatch, deadline: float) -> tuple[int | None, bool]:
        """The exit status, and whether the run ended at its result record rather than at the exit.

        The runner prints the record last, after the program's output and the session's
        ``finish``, and exits at once with the status the record implies; gVisor's teardown then
        takes ~80 ms more, a sixth of a cold start. So the run ends at whichever comes first, the
        record or the exit (deadline and output kills come through the exit). A program that
        prints a record line itself ends its own run there, with that result, and is removed
        like any other: the result was always its own to choose."""
        exited = threading.Event()
        ended = watch.collector.record_seen  # the collector sets it at the record; the waiter too
        status: list[int | None] = []

        def wait_exit() -> None:
            try:
                status.append(self.wait_for_exit(container, deadline, lambda: watch.kill("deadline")))
            except Exception as exc:  # removed under us after the record: nothing to report
                log.debug("event=sandbox_wait_ended container=%s error=%s", container.name, exc)
            exited.set()
            ended.set()

        threading.Thread(target=wait_exit, name=f"sandbox-wait-{container.name}", daemon=True).start()
        ended.wait()
        if not exited.is_set() and not watch.killed:
            record = watch.collector.result().record
            if record is not None:
                if record.get("ok"):
                    return RUNNER_EXIT_OK, True
                return (RUNNER_EXIT_SETUP_FAILED if record.get("setup") else RUNNER_EXIT_PROGRAM_FAILED), True
        exited.wait()
        return (status[0] if status else None), False
