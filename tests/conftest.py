"""Shared fixtures. Integration fixtures start *real* processes against real services and fail
with a message that says why when a dependency is unavailable, rather than skipping."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def celery_worker_process(settings) -> Iterator[str]:
    """A real ``celery worker`` subprocess consuming a private queue; yields the queue name."""
    queue = f"test-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "web.settings"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "web",
            "worker",
            "-Q",
            queue,
            "--pool",
            "solo",
            "--loglevel",
            "WARNING",
            "--hostname",
            f"{queue}@%h",
            "--without-gossip",
            "--without-mingle",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        yield queue
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_for(predicate, timeout: float, interval: float = 0.1, message: str = "condition") -> None:
    """Poll ``predicate`` until true; fail the test with ``message`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout}s waiting for {message}")
