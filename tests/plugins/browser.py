"""Browser-test fixtures: the built console, the real server on the test database, and a runner
for the Chromium scenarios in tests/browser/console.mjs (playwright-core driving Debian's
/usr/bin/chromium; no browser is ever downloaded).

Screenshots go to a temporary directory; with ``SYMPHONY_SCREENSHOTS=1`` they are written to
docs/screenshots/ instead (that is how the committed ones are refreshed).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.conf import settings

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "browser" / "console.mjs"
CHROMIUM = os.environ.get("SYMPHONY_CHROMIUM", "/usr/bin/chromium")
SCREENSHOTS = ROOT / "docs" / "screenshots"


def _node() -> str:
    local = ROOT / ".nodeenv" / "bin" / "node"
    return str(local) if local.exists() else (shutil.which("node") or "node")


def child_env_for_test_db() -> dict[str, str]:
    """Environment that points a child process at the pytest-django test database."""
    db = settings.DATABASES["default"]
    return {**os.environ, "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_uvicorn(env: dict[str, str], port: int | None = None) -> tuple[subprocess.Popen, str]:
    """Start the ASGI app under uvicorn with ``env`` (on ``port``, else a free one); return the
    process and its base URL."""
    port = port or free_port()
    # As scripts/run_stack.py: Django alone reads X-Forwarded-For (api/client_address.py).
    server = ["web.asgi:application", "--port", str(port), "--no-proxy-headers", "--log-level", "warning"]
    # Its log goes to a file, not a pipe nobody reads: a pipe fills up and then blocks the server.
    log_path = Path(tempfile.mkdtemp(prefix="uvicorn-")) / "uvicorn.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", *server], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log
        )
    proc.log_path = log_path  # type: ignore[attr-defined]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            if proc.poll() is not None:
                pytest.fail(f"uvicorn exited: {log_path.read_text(errors='replace')[-2000:]}")
            time.sleep(0.2)
    proc.kill()
    pytest.fail("uvicorn did not listen within 30 s")


def stop(proc: subprocess.Popen, timeout: float = 15) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def console_dist() -> Path:
    """frontend/dist, built through scripts/build_frontend.sh (a no-op when it is current)."""
    result = subprocess.run(
        ["scripts/build_frontend.sh"], cwd=ROOT, capture_output=True, text=True, timeout=900, check=False
    )
    if result.returncode != 0:
        pytest.fail(f"scripts/build_frontend.sh failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    index = ROOT / "frontend" / "dist" / "index.html"
    assert index.is_file(), "frontend/dist/index.html missing after the build"
    return index.parent


@pytest.fixture(scope="session")
def chromium_bin() -> str:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} not found: scripts/bootstrap.sh system installs Debian's chromium")
    return CHROMIUM


@pytest.fixture
def console_server(transactional_db, console_dist) -> Iterator[str]:
    """The real server (uvicorn, ASGI, SSE) on the test database with the built console."""
    proc, url = start_uvicorn(child_env_for_test_db())
    yield url
    stop(proc)


@pytest.fixture
def browser(chromium_bin, tmp_path) -> Callable[..., dict]:
    """``browser(scenario, baseUrl=..., **config) -> result``; fails the test with the scenario's
    error (and leaves a failure screenshot under tmp_path/artifacts)."""
    shots = SCREENSHOTS if os.environ.get("SYMPHONY_SCREENSHOTS") == "1" else tmp_path / "shots"

    def run(scenario: str, timeout: float = 300, **config) -> dict:
        user_data = tmp_path / f"chromium-{scenario}-{time.monotonic_ns()}"
        cfg = {
            "chromium": chromium_bin,
            "userDataDir": str(user_data),
            "shots": str(shots),
            "artifacts": str(tmp_path / "artifacts"),
            **config,
        }
        proc = subprocess.run(
            [_node(), str(SCRIPT), scenario, json.dumps(cfg)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        if not lines:
            pytest.fail(f"scenario {scenario} printed no result (rc={proc.returncode}):\n{proc.stderr[-4000:]}")
        result = json.loads(lines[-1])
        if not result.get("ok"):
            pytest.fail(
                f"scenario {scenario} failed at {result.get('url')}:\n{result.get('error')}\n"
                f"browser console: {result.get('consoleErrors')}\nartifacts: {cfg['artifacts']}"
            )
        return result

    return run


@pytest.fixture
def symphony_stack(transactional_db, console_dist, gpu_worker_process, sandbox_image, tmp_path) -> Iterator[str]:
    """The whole stack on the test database: the session's gpu_worker (tiny model), a Celery
    worker consuming that worker's queue (runs execute in gVisor through sandbox.run), and
    uvicorn. Yields the console's base URL."""
    name = "test"  # the name tests/plugins/worker.py gives its gpu_worker
    env = {
        **child_env_for_test_db(),
        "SYMPHONY_WORKER_NAME": name,
        "SYMPHONY_WORKER_ADMIN_SOCKET": gpu_worker_process.admin_socket,
        "SYMPHONY_SANDBOX_IMAGE": sandbox_image,
        "DJANGO_SETTINGS_MODULE": "web.settings",
    }
    log = open(tmp_path / "celery.log", "wb")
    argv = [sys.executable, "-m", "celery", "-A", "web", "worker", "-Q", f"worker.{name}", "--pool", "threads"]
    argv += ["--concurrency", "2", "--loglevel", "INFO", "--hostname", f"browser-{name}@%h"]
    argv += ["--without-gossip", "--without-mingle"]
    celery = subprocess.Popen(
        argv,
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    web, url = start_uvicorn(env)
    try:
        yield url
    finally:
        stop(web)
        stop(celery)
        log.close()
