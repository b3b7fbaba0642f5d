"""Fixtures shared by the SDK tests that talk to the real worker."""

from __future__ import annotations

import pytest

import symphony as sy


@pytest.fixture
def session(gpu_worker_process):
    """A session of its own on the shared test worker, ended after the test."""
    info = gpu_worker_process.create_session()
    s = sy.connect(info.socket_path, info.token)
    try:
        yield s
    finally:
        s.close()
        gpu_worker_process.end_session(info.session_id)
