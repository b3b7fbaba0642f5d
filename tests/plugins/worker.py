"""A real ``python -m gpu_worker`` process for tests that drive it over its sockets.

One worker (tiny random Llama with the real tokenizer, float32, Redis at 127.0.0.1:6379) is
shared by the whole test session: starting vLLM costs tens of seconds on CPU. Sockets live
under a short ``/tmp`` dir because Unix socket paths are limited to 108 bytes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import redis_db_url

ROOT = Path(__file__).resolve().parents[2]
#: Seconds a worker may take to become healthy; ``SYMPHONY_TEST_WORKER_STARTUP_S`` raises it on
#: a machine shared by several test runs (loading vLLM alone then takes minutes).
STARTUP_TIMEOUT_S = float(os.environ.get("SYMPHONY_TEST_WORKER_STARTUP_S") or 240.0)


@dataclass
class RunningWorker:
    """Handle on the worker subprocess: its sockets, admin client and log."""

    proc: subprocess.Popen
    admin_socket: str
    sessions_dir: str
    kv_store: str
    model_dir: Path
    log_path: Path
    admin: Any
    #: ``--name``: its heartbeat key and the worker name runs record.
    name: str = "test"
    _sessions: list[str] = field(default_factory=list)
    #: How it was started, for :meth:`relaunch`.
    command: list[str] = field(default_factory=list)
    environment: dict[str, str] = field(default_factory=dict)

    def relaunch(self) -> None:
        """Start the same worker again (same name, sockets and store) after its process ended,
        as a supervisor restarting it would; not awaited (``await_healthy`` is)."""
        assert self.proc.poll() is not None, "the worker is still running"
        self._sessions.clear()
        with open(self.log_path, "ab") as log_fh:
            self.proc = subprocess.Popen(
                self.command, cwd=ROOT, env=self.environment, stdout=log_fh, stderr=subprocess.STDOUT
            )

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def create_session(
        self, tenant: str | None = None, run_id: str | None = None, *, tree: str | None = None, **limits: Any
    ) -> Any:
        """A session with ``limits`` (create_session's map) in run tree ``tree`` (default: its
        own); ended by :meth:`end_session`."""
        tenant = tenant or f"t-{uuid.uuid4().hex[:8]}"
        info = self.admin.create_session(tenant, run_id or f"r-{uuid.uuid4().hex[:8]}", limits, tree=tree)
        self._sessions.append(info.session_id)
        return info

    def end_session(self, session_id: str) -> Any:
        if session_id in self._sessions:
            self._sessions.remove(session_id)
        return self.admin.end_session(session_id)

    @contextlib.contextmanager
    def session(self, tenant: str | None = None, **limits: Any) -> Iterator[Any]:
        info = self.create_session(tenant, **limits)
        try:
            yield info
        finally:
            self.end_session(info.session_id)

    def assert_alive(self) -> None:
        assert self.proc.poll() is None, f"worker exited with {self.proc.returncode}:\n{self.log_tail()}"
        assert self.admin.health()["ok"], "worker health is not ok"


def _redis_up() -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(redis_db_url(0), socket_connect_timeout=1).ping())
    except Exception:
        return False


@contextlib.contextmanager
def start_worker(model_dir: Path, *, name: str = "test", **options: Any) -> Iterator[RunningWorker]:
    """Run ``python -m gpu_worker`` on ``model_dir`` until the block exits; fail (not skip) if it
    does not become healthy. ``options``: those of :func:`_launch` (pages, KV store, Redis, more
    flags and environment, compiled or eager)."""
    with start_workers(model_dir, [name], **options) as (worker,):
        yield worker


@contextlib.contextmanager
def start_workers(model_dir: Path, names: Sequence[str], **options: Any) -> Iterator[list[RunningWorker]]:
    """Several workers of the same options (``start_worker``'s), named ``names``, started at once
    and awaited together: a worker's start-up is mostly one core's work (imports, loading), so
    two start in little more than the time of one on a 2-core machine."""
    if not _redis_up():
        pytest.fail(f"Redis is not reachable at {redis_db_url(0)} (run `make bootstrap`)")
    launched: list[tuple[RunningWorker, Path]] = []
    try:
        for name in names:
            launched.append(_launch(model_dir, name, **options))
        for worker, _ in launched:
            await_healthy(worker)
        yield [worker for worker, _ in launched]
    finally:
        for worker, base in launched:
            _stop(worker, base)


def _launch(
    model_dir: Path,
    name: str,
    *,
    dtype: str = "float32",
    num_pages: int = 64,
    kv_store: Path | None = None,
    redis_url: str | None = None,
    extra_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    compile_model: bool = False,
) -> tuple[RunningWorker, Path]:
    """Start one worker process (not awaited). ``kv_store`` (default: a private temp dir)
    outlives the worker; ``extra_args`` are more worker flags (e.g. ``["--max-connections",
    "24"]``); ``env``: more environment for the worker (e.g. ``OTEL_EXPORTER_OTLP_ENDPOINT``).
    The model runs eagerly unless ``compile_model``: the suite starts workers many times, in
    configurations a compile cache would each have to compile anew (gpu_worker/README.md,
    "Compiled forward")."""
    from gpu_worker.admin_client import AdminClient

    base = Path(tempfile.mkdtemp(prefix="symw-", dir="/tmp"))
    admin_socket = str(base / "admin.sock")
    sessions_dir = str(base / "s")
    store = str(kv_store or base / "kv")
    log_path = base / "worker.log"
    cmd = [sys.executable, "-m", "gpu_worker", "--model", str(model_dir), "--dtype", dtype]
    cmd += ["--admin-socket", admin_socket, "--sessions-dir", sessions_dir, "--kv-store", store]
    cmd += ["--num-pages", str(num_pages), "--max-model-len", "2048", "--name", name]
    cmd += ["--compile", "on" if compile_model else "off"]
    cmd += ["--redis-url", redis_url or redis_db_url(0), *extra_args]
    worker_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    with open(log_path, "wb") as log_fh:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=worker_env, stdout=log_fh, stderr=subprocess.STDOUT)
    admin = AdminClient(admin_socket, timeout=60)
    worker = RunningWorker(proc, admin_socket, sessions_dir, store, Path(model_dir), log_path, admin, name)
    worker.command, worker.environment = cmd, worker_env
    return worker, base


def await_healthy(worker: RunningWorker) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while True:
        if worker.proc.poll() is not None:
            pytest.fail(f"gpu_worker exited with {worker.proc.returncode} during start-up:\n{worker.log_tail()}")
        if os.path.exists(worker.admin_socket):
            try:
                if worker.admin.health().get("ok"):
                    return
            except Exception:  # not listening yet
                pass
        if time.monotonic() > deadline:
            pytest.fail(f"gpu_worker not healthy after {STARTUP_TIMEOUT_S}s:\n{worker.log_tail()}")
        time.sleep(0.5)


def _stop(worker: RunningWorker, base: Path) -> None:
    for sid in list(worker._sessions):
        with contextlib.suppress(Exception):
            worker.admin.end_session(sid)
    worker.proc.terminate()
    try:
        worker.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        worker.proc.kill()
        worker.proc.wait()
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def gpu_worker_process(tiny_model_dir: Path) -> Iterator[RunningWorker]:
    """One worker on the tiny model (float32) shared by the whole test session."""
    with start_worker(tiny_model_dir) as worker:
        yield worker


@pytest.fixture
def empty_stream_pool() -> None:
    """Forget the retained run streams earlier tests left in the stack's Redis, and their ledger.

    Why: each account may hold an equal share of the Redis stream pool among the accounts that
    hold some (gpu_worker/stream_ledger.py). Every test makes new accounts, so late in a full run
    a couple of hundred of them hold streams and a new account's share (~2 MB) falls under the
    plan budget a test means to reach. Tests run one at a time, so those streams are done with.
    """
    import redis

    from gpu_worker import stream_ledger

    client = redis.Redis.from_url(redis_db_url(0))
    stale = list(client.scan_iter(match="run:*", count=1000))
    for start in range(0, len(stale), 500):
        client.delete(*stale[start : start + 500])
    client.delete(*stream_ledger.KEYS)


@pytest.fixture(scope="session")
def default_model_worker(default_model_dir: Path) -> Iterator[RunningWorker]:
    """One worker on the real default model in float32 (so transformers can be matched exactly),
    shared by the modules that need the real model and nothing else of their own: its start
    costs ~25 s of a core here, twice that on a loaded CI machine."""
    with start_worker(default_model_dir, dtype="float32", name="real-model") as worker:
        yield worker
