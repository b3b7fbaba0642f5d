"""Run one LIP in a gVisor container against its worker session (DESIGN.md §6).

The container gets: runtime ``runsc``, no network, read-only root, a small ``/tmp`` tmpfs, no
capabilities, ``no-new-privileges``, pids/memory/CPU limits, a non-root user, and exactly two
mounts: the run's staging dir (program + args, read-only) and the session socket. Output is
streamed through an attach socket into a capped :class:`~sandbox.output.OutputCollector` (the
container's log driver is ``none``, so a flood never reaches the disk). The wall-clock deadline
and the output cap are enforced by killing the container. The container and the staging dir
are removed on every path; containers left by a crashed launcher are found by label and
removed by :func:`reap`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import queue
import shutil
import socket
import sys
import tempfile
import threading
import time
import uuid
import zipfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sandbox import image as sandbox_image
from sandbox.output import OutputCollector

log = logging.getLogger(__name__)

LABEL = "symphony.sandbox"
LABEL_RUN = "symphony.run_id"
LABEL_TENANT = "symphony.tenant"
LABEL_OWNER = "symphony.launcher"  # "<hostname>:<pid>" of the launcher process
LABEL_EXPIRES = "symphony.expires"  # unix time after which the container is garbage
#: Extra time past the deadline before the reaper treats a container as abandoned.
REAP_GRACE_S = 60.0
#: The runner's exit statuses (``symphony.run.EXIT_*``; checked by a test: the host does not
#: import the SDK): what a run that ended at its record would have exited with.
RUNNER_EXIT_OK, RUNNER_EXIT_PROGRAM_FAILED, RUNNER_EXIT_SETUP_FAILED = 0, 1, 2
#: How long a launcher's background remover thread waits for more work before it ends.
REMOVER_IDLE_S = 5.0
#: An exited sandbox nobody removed is reaped after this long (``SYMPHONY_SANDBOX_EXITED_GRACE_S``).
EXITED_GRACE_S = float(os.environ.get("SYMPHONY_SANDBOX_EXITED_GRACE_S") or 60)
#: Host threads gVisor itself needs (sentry + gofer Go runtimes) on top of the program's own
#: processes/threads. The docker pids limit is a host cgroup limit, so ``spec.pids`` alone would
#: starve runsc: with a host limit of 32 ``runsc start`` hangs forever (measured).
RUNSC_HOST_PIDS = 64
SOCKET_IN_SANDBOX = "/run/symphony/session.sock"
LIP_DIR = "/lip"
#: The sandbox's private tmpfs (inside the container, not the host's /tmp).
SANDBOX_TMP = "/tmp"  # noqa: S108


LABEL_POOL = "symphony.pool"  # "1" on warm-pool containers (sandbox/pool.py)
LABEL_SLOT_DIR = "symphony.slot_dir"  # host dir of a pool slot; the reaper removes it too
#: Prefix of a pool slot's host dir (the reaper only removes dirs whose name has it).
SLOT_DIR_PREFIX = "symphony-slot-"


class SandboxUnavailable(RuntimeError):
    """dockerd, the runsc runtime or the sandbox image is missing (an infrastructure fault)."""


@dataclass(frozen=True)
class SandboxLimits:
    """The resource limits fixed at container creation (a warm container serves only equal ones)."""

    memory_mb: int = 512
    cpus: float = 1.0
    pids: int = 128
    tmpfs_mb: int = 64
    #: Image tag; default: the tag of the current SDK (``sandbox.image.image_tag()``).
    image: str | None = None


@dataclass(frozen=True)
class SandboxSpec:
    """One run: what to execute, how to reach its session, and its resource limits."""

    program_path: str
    args: Any
    session_socket: str
    session_token: str
    run_id: str
    tenant: str
    deadline_s: float = 60.0
    memory_mb: int = 512
    cpus: float = 1.0
    pids: int = 128
    output_limit_bytes: int = 1 << 20
    tmpfs_mb: int = 64
    #: Image tag; default: the tag of the current SDK (``sandbox.image.image_tag()``).
    image: str | None = None

    @property
    def limits(self) -> SandboxLimits:
        return SandboxLimits(self.memory_mb, self.cpus, self.pids, self.tmpfs_mb, self.image)


@dataclass
class SandboxResult:
    """Outcome of one run. ``status``: succeeded | failed | timed_out | killed."""

    status: str
    result: Any = None
    error: str | None = None
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    output_bytes: int = 0
    #: Seconds from ``run()`` until the container was started, and until it exited.
    start_s: float = 0.0
    duration_s: float = 0.0
    container: str = ""
    timings: dict[str, float] = field(default_factory=dict)


def _docker_client(timeout: int = 120):
    import docker

    try:
        client = docker.from_env(timeout=timeout)
        info = client.info()
    except Exception as exc:
        raise SandboxUnavailable(f"dockerd is not reachable: {exc}") from exc
    if "runsc" not in (info.get("Runtimes") or {}):
        raise SandboxUnavailable("dockerd has no runsc runtime registered (scripts/bootstrap.sh services)")
    return client


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _stage(spec: SandboxSpec) -> tuple[Path, str]:
    """Copy program + args into a fresh dir readable by the sandbox user; returns (dir, program)."""
    src = Path(spec.program_path)
    if not src.is_file():
        raise FileNotFoundError(f"program {src} does not exist")
    name = "program.zip" if zipfile.is_zipfile(src) else "program.py"
    staging = Path(tempfile.mkdtemp(prefix="symphony-lip-"))
    try:
        shutil.copyfile(src, staging / name)
        (staging / "args.json").write_text(json.dumps(spec.args if spec.args is not None else {}))
        for f in staging.iterdir():
            f.chmod(0o444)
        staging.chmod(0o755)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return staging, name


class SandboxLauncher:
    """Runs LIPs in gVisor containers. Thread-safe: one ``run`` per calling thread."""

    def __init__(self, client: Any = None, image: str | None = None, runtime: str = "runsc") -> None:
        self.client = client or _docker_client()
        self.image = image
        self.runtime = runtime
        #: Tags seen to exist: asked of dockerd once, not on every run (a round trip of a cold
        #: start's budget). An image removed since fails ``create``, which forgets the tag.
        self._images_seen: set[str] = set()
        #: Containers of runs that ended at their record, removed off the caller's clock
        #: (a force-remove waits out gVisor's teardown, ~0.1 s); see :meth:`_remove_later`.
        self._removals: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._remover: threading.Thread | None = None
        self._remover_lock = threading.Lock()

    def image_for(self, limits: SandboxLimits) -> str:
        """The image tag ``limits`` resolve to; raises :class:`SandboxUnavailable` if not built."""
        tag = limits.image or self.image or sandbox_image.image_tag()
        if tag not in self._images_seen:
            if not sandbox_image.image_exists(self.client, tag):
                raise SandboxUnavailable(f"sandbox image {tag} is not built; run `make sandbox-image`")
            self._images_seen.add(tag)
        return tag

    def create(self, **config: Any) -> Any:
        """``containers.create``; a missing image (removed since it was seen) is
        :class:`SandboxUnavailable`, as it is before the first run."""
        import docker.errors

        try:
            return self.client.containers.create(**config)
        except docker.errors.ImageNotFound:
            tag = config["image"]
            self._images_seen.discard(tag)
            raise SandboxUnavailable(f"sandbox image {tag} is not built; run `make sandbox-image`") from None

    def container_config(
        self,
        limits: SandboxLimits,
        tag: str,
        *,
        command: list[str],
        environment: dict[str, str],
        mounts: list[Any],
        labels: dict[str, str],
        name_prefix: str = "symphony-lip-",
    ) -> dict[str, Any]:
        """``containers.create`` kwargs with every isolation setting of DESIGN.md §6.

        One place for the limits, so the cold path and the warm pool cannot drift apart.
        """
        from docker.types import LogConfig

        return {
            "image": tag,
            "command": command,
            "name": f"{name_prefix}{uuid.uuid4().hex[:12]}",
            "user": f"{sandbox_image.LIP_UID}:{sandbox_image.LIP_UID}",
            "runtime": self.runtime,
            "network_mode": "none",
            # Also no network *config*: without it dockerd adds its libnetwork-setkey prestart
            # hook (a re-exec of dockerd, ~70 ms of every cold start here) even for mode none.
            "network_disabled": True,
            "read_only": True,
            "tmpfs": {SANDBOX_TMP: f"rw,noexec,nosuid,nodev,size={int(limits.tmpfs_mb)}m,mode=1777"},
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
            "pids_limit": int(limits.pids) + RUNSC_HOST_PIDS,
            "mem_limit": f"{int(limits.memory_mb)}m",
            "memswap_limit": f"{int(limits.memory_mb)}m",
            "nano_cpus": int(float(limits.cpus) * 1e9),
            "working_dir": SANDBOX_TMP,
            "environment": {**environment, "HOME": SANDBOX_TMP},
            "mounts": mounts,
            "labels": {LABEL: "1", LABEL_OWNER: _owner(), **labels},
            "log_config": LogConfig(type="none"),
            "stdin_open": False,
            "tty": False,
            "detach": True,
        }

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
                LABEL_EXPIRES: str(int(time.time() + spec.deadline_s + REAP_GRACE_S)),
            },
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
                    self._remove(container)
            shutil.rmtree(staging, ignore_errors=True)

    def _remove_later(self, container: Any) -> None:
        """Remove ``container`` on this launcher's remover thread. The run is over (its record
        is in); if the process dies first, :func:`reap` removes the container once expired."""
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
            self._remove(container)

    def watch(self, container: Any, output_limit_bytes: int) -> OutputWatch:
        """Attach to ``container`` (before it starts) and pump its output into a capped collector."""
        return OutputWatch(self.client, container, output_limit_bytes)

    def _run_container(self, spec: SandboxSpec, container: Any, t0: float) -> tuple[SandboxResult, bool]:
        """The result, and whether the run ended at its record (see :meth:`_wait_for_end`)."""
        watch = self.watch(container, spec.output_limit_bytes)
        container.start()
        started = time.monotonic()
        exit_code, by_record = self._wait_for_end(container, watch, started + spec.deadline_s)
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
                status.append(self._wait(container, deadline, lambda: watch.kill("deadline")))
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

    @staticmethod
    def _wait(container: Any, deadline: float, on_deadline) -> int | None:
        """Wait for exit; past ``deadline`` call ``on_deadline`` (kill) and wait for the exit."""
        import requests

        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                on_deadline()
                left = 30.0
                deadline = float("inf")
            try:
                out = container.wait(timeout=max(1, min(left, 3600)))
                return int(out.get("StatusCode", -1))
            except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
                if deadline == float("inf"):
                    return None
                continue

    @staticmethod
    def _remove(container: Any) -> None:
        try:
            container.remove(force=True)
        except Exception as exc:
            log.warning("event=sandbox_remove_failed container=%s error=%s", getattr(container, "name", "?"), exc)


class OutputWatch:
    """A container's output stream pumped into a capped collector, and the one way to kill it.

    Attach before ``start`` (``logs=False`` never replays). Past the cap the pump keeps draining
    (the collector discards) and the container is killed from another thread: runsc cannot finish
    a kill while the program is blocked writing to an output pipe nobody reads.
    """

    def __init__(self, client: Any, container: Any, output_limit_bytes: int) -> None:
        self.container = container
        self.collector = OutputCollector(output_limit_bytes)
        #: The first kill reason ("deadline", "output"); later reasons are ignored.
        self.killed: dict[str, str] = {}
        self._kill_lock = threading.Lock()
        self._stream = client.api.attach(container.id, stdout=True, stderr=True, stream=True, logs=False, demux=True)
        self._reader = threading.Thread(target=self._pump, name=f"sandbox-output-{container.name}", daemon=True)
        self._reader.start()

    def kill(self, reason: str) -> None:
        with self._kill_lock:
            if self.killed:
                return
            self.killed[reason] = reason
        try:
            self.container.kill()
        except Exception as exc:  # already exited, or dockerd trouble (then remove() finishes it)
            log.warning("event=sandbox_kill_failed container=%s reason=%s error=%s", self.container.name, reason, exc)

    def _pump(self) -> None:
        try:
            for out, err in self._stream:
                if out:
                    self.collector.feed_stdout(out)
                if err:
                    self.collector.feed_stderr(err)
                if self.collector.exceeded and not self.killed:
                    threading.Thread(target=self.kill, args=("output",), daemon=True).start()
        except Exception as exc:
            log.debug("attach stream of %s ended: %s", self.container.name, exc)

    def close(self, join_s: float = 10.0) -> None:
        """Wait (bounded) for the stream to end, then close it."""
        if join_s > 0:
            self._reader.join(timeout=join_s)
        try:
            self._stream.close()
        except Exception:  # noqa: S110 - best effort; the container is removed next
            pass


def container_state(container: Any) -> dict[str, Any]:
    """``State`` of an exited container (``{}`` if dockerd cannot say)."""
    try:
        container.reload()
        return container.attrs.get("State", {}) or {}
    except Exception as exc:
        log.debug("inspect %s: %s", getattr(container, "name", "?"), exc)
        return {}


def finish_result(
    res: SandboxResult, spec: SandboxSpec, watch: OutputWatch, exit_code: int | None, state: dict[str, Any]
) -> None:
    """Fill ``res`` from the captured output and the exit: one classification for cold and warm runs."""
    cap = watch.collector.result()
    killed = watch.killed
    res.exit_code, res.stdout, res.stderr, res.output_bytes = exit_code, cap.stdout, cap.stderr, cap.total_bytes
    record = cap.record or {}
    if "deadline" in killed:
        res.status, res.error = "timed_out", f"deadline of {spec.deadline_s:g}s exceeded; the sandbox was killed"
    elif "output" in killed or cap.exceeded:
        res.status = "killed"
        res.error = f"output limit of {spec.output_limit_bytes} bytes exceeded; the sandbox was killed"
    elif state.get("OOMKilled"):
        res.status, res.error = "killed", f"memory limit of {spec.memory_mb} MiB exceeded; the sandbox was killed"
    elif exit_code == 0 and record.get("ok"):
        res.status, res.result = "succeeded", record.get("result")
    elif exit_code == 0:
        res.error = "the program exited without reporting a result"
    elif record.get("error"):
        res.error = str(record["error"])
    elif exit_code is not None and exit_code >= 128:
        res.status = "killed"
        res.error = (
            f"the sandbox was killed by signal {exit_code - 128} (memory limit of {spec.memory_mb} MiB?)"
            + _tail(cap.stderr)
        )
    elif cap.record is None:
        # The runner always prints a record unless the whole sandbox died under it.
        res.error = (
            f"the sandbox died with status {exit_code} before the program finished"
            f" (killed or crashed; e.g. its process limit of {spec.pids} was hit)" + _tail(cap.stderr)
        )
    else:
        res.error = f"the sandbox exited with status {exit_code}" + _tail(cap.stderr)
    log.info(
        "event=sandbox_done run=%s tenant=%s status=%s exit=%s start_s=%.3f run_s=%.3f output_bytes=%d warm=%s",
        spec.run_id,
        spec.tenant,
        res.status,
        exit_code,
        res.start_s,
        res.duration_s,
        res.output_bytes,
        bool(res.timings.get("warm")),
    )


def _tail(text: str, n: int = 2000) -> str:
    text = text.strip()
    return f": {text[-n:]}" if text else ""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_slot_dir(path: str) -> None:
    """Remove a dead pool slot's host dir (only a dir named like one: the label is our own,
    but a bad path must never turn into ``rm -rf`` of something else)."""
    if path and os.path.isabs(path) and Path(path).name.startswith(SLOT_DIR_PREFIX):
        shutil.rmtree(path, ignore_errors=True)


def _exited_long_ago(container: Any, now: float, grace_s: float) -> bool:
    """An exited sandbox whose launcher never removed it (dockerd restarted under a run, the
    removal failed) is garbage once it has been stopped for ``grace_s``: a live launcher reads
    its exit status within moments of the exit."""
    if container.status not in ("exited", "dead"):
        return False
    finished = (container.attrs.get("State") or {}).get("FinishedAt", "")
    try:
        stopped = datetime.strptime(finished[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return False
    return stopped > 0 and now - stopped > grace_s


def _sandbox_containers(client: Any) -> list[Any]:
    """Every Symphony sandbox container, each inspected (labels, ``State.FinishedAt``).

    Listed sparse and inspected one by one, skipping any removed in between: a launcher removes
    its container when a run ends, and a full listing inspects every container itself and fails
    whole on the first that vanished under it."""
    import docker.errors

    found = []
    for c in client.containers.list(all=True, sparse=True, filters={"label": LABEL}):
        try:
            c.reload()
        except docker.errors.NotFound:
            continue
        found.append(c)
    return found


def reap(client: Any = None, now: float | None = None, exited_grace_s: float = EXITED_GRACE_S) -> list[str]:
    """Remove sandbox containers whose launcher died, whose deadline (+ grace) passed, or that
    exited more than ``exited_grace_s`` ago without being removed.

    Warm-pool containers carry the same labels (their expiry covers the pool's idle age plus its
    longest deadline), so an orphaned pool is reaped like a crashed run, slot dirs included.

    Run periodically (``python -m sandbox.launcher reap``) and at worker/executor start-up.
    """
    client = client or _docker_client()
    now = time.time() if now is None else now
    host = socket.gethostname()
    removed: list[str] = []
    for c in _sandbox_containers(client):
        labels = c.labels or {}
        owner_host, _, pid = labels.get(LABEL_OWNER, "").rpartition(":")
        try:
            expires = float(labels.get(LABEL_EXPIRES, "0"))
        except ValueError:
            expires = 0.0
        orphan = owner_host == host and pid.isdigit() and not _pid_alive(int(pid))
        if orphan or expires < now or _exited_long_ago(c, now, exited_grace_s):
            try:
                c.remove(force=True)
                removed.append(c.name)
            except Exception as exc:
                log.warning("event=reap_failed container=%s error=%s", c.name, exc)
                continue
            _remove_slot_dir(labels.get(LABEL_SLOT_DIR, ""))
    if removed:
        log.info("event=sandbox_reaped count=%d containers=%s", len(removed), ",".join(removed))
    return removed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sandbox.launcher")
    parser.add_argument("command", choices=["reap"])
    parser.parse_args(argv)
    print(json.dumps({"removed": reap()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
