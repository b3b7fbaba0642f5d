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

# Fixtures that several test areas share live in tests/plugins/<name>.py (one module per part of
# the system: model, worker, sandbox, api, ...) and are loaded here, so no area imports another's
# conftest.
pytest_plugins = sorted(
    f"tests.plugins.{path.stem}" for path in (ROOT / "tests" / "plugins").glob("*.py") if not path.name.startswith("_")
)


@contextlib.contextmanager
def celery_worker(queue: str, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen]:
    """A real ``celery worker`` subprocess consuming ``queue``; stopped (TERM, then KILL) on exit."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "web.settings", **(env or {})}
    cmd = [sys.executable, "-m", "celery", "-A", "web", "worker", "-Q", queue, "--pool", "solo"]
    cmd += ["--loglevel", "WARNING", "--hostname", f"{queue}@%h", "--without-gossip", "--without-mingle"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
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
