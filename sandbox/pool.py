"""A warm pool of pre-started gVisor containers, so a run starts in milliseconds (benchmark B8, bench/README.md).

Why it is shaped like this: a container's mounts are fixed when it is created, but a run's
session socket exists only once the worker created the session. So each slot gets a host dir

    <root>/symphony-slot-XXXX/        0711 (not listable by other host users)
        lip/                          0755, bind-mounted read-only at /lip
        run/                          0711, bind-mounted read-only at /run/symphony
            control.sock              the launcher's listener; unlinked once the runner connected

and its container runs ``python3 -I -B -m symphony.run --wait /run/symphony/control.sock``:
Python starts, imports the SDK, connects to the control socket and blocks. A slot is *ready*
when that connection was accepted. Hand-off (:meth:`SandboxPool.run`):

1. hard-link the session socket to ``run/session.sock`` (``link(2)`` works on socket inodes
   within one filesystem; connecting through a read-only bind mount works under runsc with
   ``--host-uds=open`` — measured). On another filesystem (``EXDEV``) or any other refusal the
   untouched slot goes back to the pool and the caller takes the cold path;
2. copy the program and write ``args.json`` into ``lip/`` (the same paths as the cold path);
3. send one job line ``{"program", "token", "run_id"}`` on the control connection. The token
   never touches the disk and only this slot's runner holds that connection.

The runner reports ``connected`` (its ``hello`` succeeded: the run's first syscall) and ``done``
(exit status + sha256 of its result record). The run is over when ``done`` arrived and the
record with that hash came through the output stream (so all stdout before it was captured):
gVisor's teardown (~0.2 s) is not on the run's path. A runner that dies, a deadline (measured
from the hand-off) and the output cap take the cold path's route: kill, ``docker wait``,
inspect. The result is classified by the same :func:`sandbox.outcome.finish_result`.

Isolation is the cold path's, from the same :meth:`SandboxHost.container_config`: a slot
serves only specs whose fixed limits (memory, cpus, pids, tmpfs, image) equal the pool's and
whose deadline fits the expiry label the reaper uses. A slot is used once: afterwards its
container is removed and its dir deleted, and a fresh slot is started in the background. Idle
slots are recycled after ``max_idle_s``. Containers carry the reaper's labels (owner pid and an
expiry covering idle age + longest deadline) plus the slot dir, so an orphaned pool is reaped.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import queue
import shutil
import socket
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandbox import image as sandbox_image
from sandbox.containers import OutputWatch, SandboxHost, container_state
from sandbox.outcome import finish_result
from sandbox.spec import (
    LABEL_EXPIRES,
    LABEL_POOL,
    LABEL_RUN,
    LABEL_SLOT_DIR,
    LABEL_TENANT,
    LIP_DIR,
    REAP_GRACE_S,
    SLOT_DIR_PREFIX,
    SOCKET_IN_SANDBOX,
    SandboxLimits,
    SandboxResult,
    SandboxSpec,
)
from sandbox.staging import stage_program

log = logging.getLogger(__name__)

RUN_DIR_IN_SANDBOX = str(Path(SOCKET_IN_SANDBOX).parent)  # /run/symphony
CONTROL_SOCKET = "control.sock"
WARM_COMMAND = ["python3", "-I", "-B", "-m", "symphony.run", "--wait", f"{RUN_DIR_IN_SANDBOX}/{CONTROL_SOCKET}"]
SESSION_SOCKET = Path(SOCKET_IN_SANDBOX).name  # session.sock
#: Bytes the launcher reads from a control connection before it stops listening to it (the
#: program can write there; it gets nothing for it but an early end of its own run).
MAX_CONTROL_BYTES = 64 * 1024
#: After ``done``: how long to wait for the result record to come through the output stream.
RECORD_GRACE_S = 2.0
#: Pause after a slot failed to start, so a broken image does not become a busy loop.
FAILURE_BACKOFF_S = 5.0
#: ``sun_path`` size on Linux (including the terminating NUL).
MAX_UNIX_PATH = 108
ENV_POOL_SIZE = "SYMPHONY_SANDBOX_POOL_SIZE"
ENV_POOL_DIR = "SYMPHONY_SANDBOX_POOL_DIR"


class HandoffRefused(Exception):
    """The slot cannot take this run (e.g. the session socket is on another filesystem)."""


class SlotLost(Exception):
    """The slot's runner was gone when the job was sent (it never saw the run)."""


@dataclass(eq=False)
class Slot:
    """One pre-started container waiting on its control connection."""

    container: Any
    watch: OutputWatch
    dir: Path
    control: socket.socket
    #: Seconds from creation until the runner connected (Python + SDK import); off the run path.
    ready_s: float
    ready_at: float = field(default_factory=time.monotonic)
    retired: bool = False

    @property
    def name(self) -> str:
        return str(self.container.name)

    def alive(self) -> bool:
        """The runner still holds its control connection (EOF means it died while idle)."""
        try:
            return self.control.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
        except BlockingIOError:
            return True
        except OSError:
            return False


def _mkdir(path: Path, mode: int) -> Path:
    path.mkdir(mode=mode, exist_ok=True)
    path.chmod(mode)  # mkdir's mode is masked by the umask
    return path


class SandboxPool:
    """``size`` warm containers with ``template``'s limits; ``run(spec)`` or ``None`` (go cold).

    Thread-safe: any number of threads may call :meth:`run` / :meth:`acquire` concurrently.
    """

    def __init__(
        self,
        launcher: SandboxHost,
        size: int = 2,
        template: SandboxLimits | None = None,
        *,
        max_deadline_s: float = 3600.0,
        max_idle_s: float = 600.0,
        root: str | os.PathLike[str] | None = None,
        ready_timeout_s: float = 60.0,
    ) -> None:
        self.launcher = launcher
        self.size = max(0, int(size))
        self.template = template or SandboxLimits()
        self.max_deadline_s = float(max_deadline_s)
        self.max_idle_s = float(max_idle_s)
        self.root = Path(root or os.environ.get(ENV_POOL_DIR) or tempfile.gettempdir()) / "symphony-pool"
        self.ready_timeout_s = float(ready_timeout_s)
        self.tag = ""
        self._ready: deque[Slot] = deque()
        self._in_use: set[Slot] = set()
        self._starting = 0
        self._cond = threading.Condition()
        self._closed = False
        self._retire_q: queue.Queue[Slot | None] = queue.Queue()
        self._threads: list[threading.Thread] = []

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> SandboxPool:
        """Resolve the image (raises ``SandboxUnavailable``) and start filling in the background."""
        longest = self.root / f"{SLOT_DIR_PREFIX}{'x' * 8}" / "run" / CONTROL_SOCKET
        if len(os.fsencode(longest)) >= MAX_UNIX_PATH:
            raise ValueError(f"pool root {self.root} is too long for AF_UNIX socket paths ({longest})")
        self.tag = self.launcher.image_for(self.template)
        self.root.parent.mkdir(parents=True, exist_ok=True)
        _mkdir(self.root, 0o711)
        for target, name in ((self._refill_loop, "refill"), (self._retire_loop, "retire")):
            t = threading.Thread(target=target, name=f"sandbox-pool-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def wait_ready(self, n: int | None = None, timeout: float = 60.0) -> bool:
        """Block until ``n`` (default: ``size``) slots are ready; for tests and benchmarks."""
        n = self.size if n is None else n
        end = time.monotonic() + timeout
        with self._cond:
            while len(self._ready) < n:
                left = end - time.monotonic()
                if left <= 0 or self._closed:
                    return False
                self._cond.wait(left)
        return True

    def close(self) -> None:
        """Stop refilling and remove every container of the pool (idle, starting and in use)."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        refill, retire = self._threads or (None, None)
        if refill is not None:
            refill.join(timeout=self.ready_timeout_s + 30)
        with self._cond:
            slots = list(self._ready) + list(self._in_use)
            self._ready.clear()
        for slot in slots:
            self._retire(slot)
        self._retire_q.put(None)
        if retire is not None:
            retire.join(timeout=120)

    def __enter__(self) -> SandboxPool:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ runs
    def compatible(self, spec: SandboxSpec) -> bool:
        """Whether a warm slot enforces exactly ``spec``'s fixed limits (else: cold path)."""
        limits = spec.limits
        image = limits.image or self.launcher.image or sandbox_image.image_tag()
        return (
            image == self.tag
            and int(limits.memory_mb) == int(self.template.memory_mb)
            and float(limits.cpus) == float(self.template.cpus)
            and int(limits.pids) == int(self.template.pids)
            and int(limits.tmpfs_mb) == int(self.template.tmpfs_mb)
            and 0 < float(spec.kill_after_s) <= self.max_deadline_s
        )

    def acquire(self, spec: SandboxSpec | None = None) -> Slot | None:
        """A ready slot (now owned by the caller), or ``None``: none ready, closed, or ``spec``
        needs other limits."""
        if spec is not None and not self.compatible(spec):
            return None
        dead: list[Slot] = []
        slot = None
        with self._cond:
            while self._ready and not self._closed:
                candidate = self._ready.popleft()
                if candidate.alive():
                    slot = candidate
                    self._in_use.add(slot)
                    break
                dead.append(candidate)
            self._cond.notify_all()
        for d in dead:
            log.warning("event=sandbox_pool_slot_died container=%s", d.name)
            self._retire(d)
        return slot

    def _give_back(self, slot: Slot) -> None:
        with self._cond:
            self._in_use.discard(slot)
            if self._closed:
                self._retire(slot)
            else:
                self._ready.appendleft(slot)
            self._cond.notify_all()

    def run(self, spec: SandboxSpec) -> SandboxResult | None:
        """Run ``spec`` in a warm slot; ``None`` if the pool cannot (the caller runs it cold)."""
        if not Path(spec.session_socket).exists():
            raise FileNotFoundError(f"session socket {spec.session_socket} does not exist")
        slot = self.acquire(spec)
        if slot is None:
            return None
        try:
            return self.run_in(slot, spec)
        except HandoffRefused as exc:
            log.info("event=sandbox_pool_cold reason=%s run=%s", exc, spec.run_id)
            self._give_back(slot)
            return None
        except SlotLost as exc:
            log.warning("event=sandbox_pool_cold reason=%s run=%s", exc, spec.run_id)
            return None

    def run_in(self, slot: Slot, spec: SandboxSpec) -> SandboxResult:
        """Hand ``spec`` to ``slot`` (from :meth:`acquire`) and wait for the end; the slot is
        retired afterwards whatever happens. Raises :class:`HandoffRefused` with the slot untouched."""
        t0 = time.monotonic()
        link = slot.dir / "run" / SESSION_SOCKET
        try:
            os.link(spec.session_socket, link)
        except OSError as exc:
            raise HandoffRefused(f"cannot link the session socket into the slot: {exc}") from exc
        try:
            return self._handoff(slot, spec, t0)
        finally:
            self._retire(slot)

    def _handoff(self, slot: Slot, spec: SandboxSpec, t0: float) -> SandboxResult:
        program = stage_program(spec, slot.dir / "lip")
        slot.watch.collector.limit = max(0, int(spec.output_limit_bytes))
        job = {"program": f"{LIP_DIR}/{program}", "token": spec.session_token, "run_id": spec.run_id}
        try:
            slot.control.sendall(json.dumps(job).encode() + b"\n")
        except OSError as exc:
            raise SlotLost(f"runner of {slot.name} is gone: {exc}") from exc
        handed = time.monotonic()
        log.info(
            "event=sandbox_pool_handoff run=%s tenant=%s container=%s", spec.run_id, spec.tenant, slot.container.name
        )
        deadline = handed + spec.kill_after_s
        events = _read_events(slot.control, deadline)
        exit_code: int | None = None
        state: dict[str, Any] = {}
        ended = None
        if events.done is not None and not slot.watch.killed:
            ended = time.monotonic()
            if _await_record(slot.watch, events.done.get("record"), min(deadline, ended + RECORD_GRACE_S)):
                code = events.done.get("exit")
                exit_code = code if isinstance(code, int) and not isinstance(code, bool) else None
            else:
                ended = None
        if ended is None:  # runner died, deadline, output cap, or an unconfirmed done: the cold way
            if time.monotonic() >= deadline:
                slot.watch.kill("deadline")
            exit_code = SandboxHost.wait_for_exit(slot.container, deadline, lambda: slot.watch.kill("deadline"))
            ended = time.monotonic()
            slot.watch.close()
            state = container_state(slot.container)
        timings = {
            "warm": 1.0,
            "handoff_s": handed - t0,
            "run_s": ended - handed,
            "slot_ready_s": slot.ready_s,
            "slot_idle_s": t0 - slot.ready_at,
        }
        if events.connected_at is not None:
            timings["first_syscall_s"] = events.connected_at - handed
        res = SandboxResult(
            status="failed", start_s=handed - t0, duration_s=ended - handed, container=slot.name, timings=timings
        )
        finish_result(res, spec, slot.watch, exit_code, state)
        return res

    # ------------------------------------------------------------------ background work
    def _retire(self, slot: Slot) -> None:
        """Unlink the session socket and close the control connection now; remove the container
        and the slot dir in the background (gVisor's teardown takes ~0.2 s). Idempotent."""
        with self._cond:
            if slot.retired:
                return
            slot.retired = True
        with contextlib.suppress(OSError):
            (slot.dir / "run" / SESSION_SOCKET).unlink()
        with contextlib.suppress(OSError):
            slot.control.close()
        with self._cond:
            self._in_use.discard(slot)
            self._cond.notify_all()
        self._retire_q.put(slot)

    def _retire_loop(self) -> None:
        while True:
            slot = self._retire_q.get()
            if slot is None:
                return
            SandboxHost.remove(slot.container)
            slot.watch.close(join_s=0)
            shutil.rmtree(slot.dir, ignore_errors=True)

    def _refill_loop(self) -> None:
        while True:
            with self._cond:
                if self._closed:
                    return
                now = time.monotonic()
                stale = [s for s in self._ready if now - s.ready_at > self.max_idle_s]
                for s in stale:
                    self._ready.remove(s)
                want = len(self._ready) + self._starting < self.size
                if want:
                    self._starting += 1
            for s in stale:
                log.info("event=sandbox_pool_recycled container=%s", s.name)
                self._retire(s)
            if not want:
                with self._cond:
                    self._cond.wait(timeout=min(5.0, self.max_idle_s))
                continue
            slot, failed = None, False
            try:
                slot = self._new_slot()
            except Exception as exc:
                log.warning("event=sandbox_pool_start_failed error=%s", exc)
                failed = True
            with self._cond:
                self._starting -= 1
                if slot is not None and not self._closed:
                    self._ready.append(slot)
                    slot = None
                self._cond.notify_all()
                if failed and not self._closed:
                    self._cond.wait(timeout=FAILURE_BACKOFF_S)
            if slot is not None:  # the pool was closed while it started
                self._retire(slot)

    def _new_slot(self) -> Slot:
        from docker.types import Mount

        t0 = time.monotonic()
        slot_dir = Path(tempfile.mkdtemp(prefix=SLOT_DIR_PREFIX, dir=self.root))
        container = None
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            slot_dir.chmod(0o711)
            lip = _mkdir(slot_dir / "lip", 0o755)
            run = _mkdir(slot_dir / "run", 0o711)
            control_path = run / CONTROL_SOCKET
            listener.bind(str(control_path))
            control_path.chmod(0o666)  # the sandbox user connects; the dirs above hide it
            listener.listen(1)
            listener.settimeout(self.ready_timeout_s)
            config = self.launcher.container_config(
                self.template,
                self.tag,
                command=WARM_COMMAND,
                environment={"SYMPHONY_SOCKET": SOCKET_IN_SANDBOX, "SYMPHONY_ARGS_FILE": f"{LIP_DIR}/args.json"},
                mounts=[
                    Mount(LIP_DIR, str(lip), type="bind", read_only=True),
                    Mount(RUN_DIR_IN_SANDBOX, str(run), type="bind", read_only=True),
                ],
                labels={
                    LABEL_RUN: "pool",
                    LABEL_TENANT: "",
                    LABEL_POOL: "1",
                    LABEL_SLOT_DIR: str(slot_dir),
                    LABEL_EXPIRES: str(int(time.time() + self.max_idle_s + self.max_deadline_s + REAP_GRACE_S)),
                },
                name_prefix="symphony-lip-pool-",
            )
            container = self.launcher.create(**config)
            watch = self.launcher.watch(container, 1 << 20)
            container.start()
            conn, _ = listener.accept()
            conn.settimeout(None)
        except BaseException:
            if container is not None:
                SandboxHost.remove(container)
            shutil.rmtree(slot_dir, ignore_errors=True)
            raise
        finally:
            listener.close()
            with contextlib.suppress(OSError):
                (slot_dir / "run" / CONTROL_SOCKET).unlink()
        slot = Slot(container, watch, slot_dir, conn, ready_s=time.monotonic() - t0)
        log.info("event=sandbox_pool_ready container=%s ready_s=%.3f", slot.name, slot.ready_s)
        return slot


@dataclass
class _Events:
    connected_at: float | None = None
    done: dict[str, Any] | None = None


def _read_events(conn: socket.socket, deadline: float) -> _Events:
    """Read the runner's event lines until ``done``, EOF, too much data, or the deadline."""
    events = _Events()
    buf = bytearray()
    total = 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return events
        conn.settimeout(left)
        try:
            chunk = conn.recv(4096)
        except TimeoutError:
            continue
        except OSError:
            return events
        if not chunk:
            return events
        total += len(chunk)
        if total > MAX_CONTROL_BYTES:
            return events
        buf.extend(chunk)
        while b"\n" in buf:
            line, _, rest = bytes(buf).partition(b"\n")
            buf[:] = rest
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if not isinstance(msg, dict):
                continue
            if msg.get("event") == "connected" and events.connected_at is None:
                events.connected_at = time.monotonic()
            elif msg.get("event") == "done":
                events.done = msg
                return events


def _await_record(watch: OutputWatch, digest: Any, until: float) -> bool:
    """Wait until the output stream delivered the record whose sha256 the runner reported."""
    if not isinstance(digest, str):
        return False
    while True:
        line = watch.collector.last_record_line()
        if line is not None and hashlib.sha256(line).hexdigest() == digest:
            return True
        if time.monotonic() >= until or watch.killed:
            return False
        time.sleep(0.001)


def _default_root() -> Path:
    """Next to the worker's sessions dir (``SYMPHONY_SESSIONS_DIR``, default ``var/run/sessions``),
    so session sockets can be hard-linked into slots (same filesystem)."""
    env = os.environ.get(ENV_POOL_DIR)
    if env:
        return Path(env)
    sessions = Path(os.environ.get("SYMPHONY_SESSIONS_DIR") or "var/run/sessions")
    if not sessions.is_absolute():
        sessions = sandbox_image.ROOT / sessions
    return sessions.parent


_shared: SandboxPool | None = None
_shared_lock = threading.Lock()


def shared_pool(image: str | None = None) -> SandboxPool | None:
    """The process-wide pool, sized by ``SYMPHONY_SANDBOX_POOL_SIZE`` (unset or 0: none).

    Started lazily on first use (so a forked executor child starts its own) and closed at exit.
    Any failure to start it means "no pool": runs then take the cold path.
    """
    global _shared
    size = int(os.environ.get(ENV_POOL_SIZE) or 0)
    if size <= 0:
        return None
    with _shared_lock:
        if _shared is None:
            import atexit

            try:
                pool = SandboxPool(
                    SandboxHost(image=image), size=size, template=SandboxLimits(image=image), root=_default_root()
                )
                _shared = pool.start()
                atexit.register(pool.close)
            except Exception as exc:
                log.warning("event=sandbox_pool_unavailable error=%s", exc)
                return None
        return _shared
