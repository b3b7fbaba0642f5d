"""Shared fixtures. Integration fixtures start *real* processes against real services and fail
with a message that says why when a dependency is unavailable, rather than skipping."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def redis_db_url(db: int) -> str:
    """Database ``db`` of the Redis server the stack uses (``REDIS_URL``'s host and port), so a
    test run pointed at another Redis (several checkouts testing on one machine) stays on it."""
    from urllib.parse import urlsplit

    base = urlsplit(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    return f"{base.scheme}://{base.netloc}/{db}"


# Fixtures that several test areas share live in tests/plugins/<name>.py (one module per part of
# the system: model, worker, sandbox, api, ...) and are loaded here, so no area imports another's
# conftest.
pytest_plugins = sorted(
    f"tests.plugins.{path.stem}" for path in (ROOT / "tests" / "plugins").glob("*.py") if not path.name.startswith("_")
)


#: Flask is never imported in the test process. vLLM's kernel dispatcher inspects every
#: attribute of every loaded module when an in-process engine starts, and Flask's ``current_app``
#: and ``request`` proxies raise outside an app context, so every engine test after anything that
#: imported Flask errors with a message naming neither. schemathesis's WSGI transport imports it
#: lazily and copes without it (tests/security/test_api_fuzz.py); moto's in-process mode needs it,
#: so S3 tests run moto's server in its own process (tests/plugins/s3.py). A ``None`` entry makes
#: ``import flask`` raise ImportError here, and only here.
sys.modules.setdefault("flask", None)  # type: ignore[arg-type]


@contextlib.contextmanager
def celery_worker(
    queue: str, env: dict[str, str] | None = None, concurrency: int | None = None
) -> Iterator[subprocess.Popen]:
    """A real ``celery worker`` subprocess consuming ``queue``; stopped (TERM, then KILL) on exit.

    One task at a time (``--pool solo``) unless ``concurrency`` asks for a thread pool of that
    many. Its log goes to a file (``proc.log_path``): a pipe nobody reads blocks it once full."""
    import tempfile

    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "web.settings", **(env or {})}
    pool = ["--pool", "threads", "--concurrency", str(concurrency)] if concurrency else ["--pool", "solo"]
    cmd = [sys.executable, "-m", "celery", "-A", "web", "worker", "-Q", queue, *pool]
    cmd += ["--loglevel", "WARNING", "--hostname", f"{queue}@%h", "--without-gossip", "--without-mingle"]
    log_path = Path(tempfile.mkdtemp(prefix="celery-")) / "celery.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    proc.log_path = log_path  # type: ignore[attr-defined]
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def celery_worker_process(settings) -> Iterator[str]:
    """A real ``celery worker`` subprocess consuming a private queue; yields the queue name."""
    queue = f"test-{uuid.uuid4().hex[:8]}"
    with celery_worker(queue):
        yield queue


def container_names(docker_client, *, include_stopped: bool = True, **filters: str) -> list[str]:
    """Names of the containers matching ``filters`` (e.g. ``label="k=v"``, ``name=...``).

    Listed sparse: a full listing inspects every container and fails whole with NotFound on one
    that a launcher removed in between, which is exactly what these tests wait for."""
    listed = docker_client.containers.list(all=include_stopped, sparse=True, filters=filters)
    return [c.attrs["Names"][0].lstrip("/") for c in listed]


def wait_for(predicate, timeout: float, interval: float = 0.1, message: str = "condition") -> None:
    """Poll ``predicate`` until true; fail the test with ``message`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout}s waiting for {message}")


def at_once(calls: list[Callable[[], object]]) -> list[object]:
    """Run each call on its own thread, released together by a barrier, for races on the real
    database; each thread closes its own connection. Results in order; an exception is re-raised."""
    import threading

    from django.db import connection

    barrier = threading.Barrier(len(calls))

    def run(call: Callable[[], object]) -> object:
        try:
            barrier.wait(timeout=10)
            return call()
        finally:
            connection.close()

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(run, calls))
