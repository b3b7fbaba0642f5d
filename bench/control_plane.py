"""The Symphony control plane as benchmark subprocesses: a migrated database, the environment
its processes run with, and uvicorn / Celery processes stopped in reverse order.

Shared by the benchmarks that drive the whole service (B9 through the REST API and the CLI's
client, B11 through the ``openai`` client) rather than a worker alone.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.harness import ROOT, log_tail, wait_until_healthy

#: How long a web process may take to answer its first request, seconds.
SERVER_START_S = 60.0


def database_ready(url: str | None = None) -> None:
    """``url``'s database (default: ``DATABASE_URL``'s) exists (created if not) and is migrated."""
    import psycopg

    url = url or os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/symphony")
    try:
        psycopg.connect(url, connect_timeout=5).close()
    except psycopg.OperationalError as exc:
        if "does not exist" not in str(exc):
            raise
        base, _, name = url.rpartition("/")
        with psycopg.connect(f"{base}/postgres", autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
        cwd=ROOT,
        check=True,
        env=control_plane_env(DATABASE_URL=url),
        timeout=600,
    )


def control_plane_env(**extra: str) -> dict[str, str]:
    """This process's environment for a control-plane process, with ``extra`` on top."""
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "web.settings",
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "sandbox")]),
        **extra,
    }


class Processes:
    """Subprocesses of the control plane, stopped (TERM, then KILL) in reverse order."""

    def __init__(self) -> None:
        self.procs: list[tuple[str, subprocess.Popen, Path]] = []
        self.dir = Path(tempfile.mkdtemp(prefix="symb-stack-", dir="/tmp"))

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen:
        log = self.dir / f"{name}.log"
        with open(log, "wb") as fh:
            out = subprocess.STDOUT
            proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=fh, stderr=out, start_new_session=True)
        self.procs.append((name, proc, log))
        return proc

    def web(self, name: str, env: dict[str, str]) -> str:
        from bench.baseline_server import free_port

        port = free_port()
        argv = [sys.executable, "-m", "uvicorn", "web.asgi:application", "--port", str(port), "--no-proxy-headers"]
        proc = self.start(name, [*argv, "--log-level", "warning"], env)
        url = f"http://127.0.0.1:{port}"

        def healthy() -> bool:
            import httpx

            return httpx.get(f"{url}/v1/models", timeout=5).status_code in (200, 401)

        wait_until_healthy(name, proc, healthy, SERVER_START_S, self.dir / f"{name}.log")
        return url

    def tail(self, name: str) -> str:
        return next((log_tail(log) for n, _, log in self.procs if n == name), "")

    def close(self) -> None:
        for _, proc, _ in reversed(self.procs):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, 15)
        for _, proc, _ in reversed(self.procs):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, 9)
                proc.wait(timeout=10)
