"""The control plane around a real worker: ASGI server (uvicorn) and a Celery worker process,
both on the test database and routed to the worker a test module provides as ``stack_worker``.

A module that uses ``stack`` defines ``stack_worker`` (a ``RunningWorker``): the real model for
end-to-end checks, the tiny one where the model does not matter, a private one to kill. It may
override ``stack_env`` to give the control plane more settings (e.g. a warm sandbox pool), and
``stack_concurrency`` to have Celery execute that many runs at once (load tests). A module whose
runs neither harm the worker nor depend on its being fresh returns ``shared_stack_worker`` (or
``shared_real_model_worker``): a session's worker, which saves a worker start (~25 s of a core
on CI) per module.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from tests.conftest import celery_worker
from tests.plugins.worker import RunningWorker

#: Slugs of the tenants the API fixtures create (``api_tenant_a`` and ``api_tenant_b``): their
#: KV files on the shared worker are deleted after each module, so none reaches the next.
FIXTURE_TENANT_SLUGS = ("alpha", "beta")


class StackURL(str):
    """The API's base URL, plus the stack's Celery worker process and its queue, for tests that
    inject faults into it."""

    celery: subprocess.Popen
    queue: str
    env: dict[str, str]


def _lent(worker: RunningWorker) -> Iterator[RunningWorker]:
    """``worker`` for one module, left without the fixture tenants' KV files when it ends."""
    yield worker
    for slug in FIXTURE_TENANT_SLUGS:
        worker.admin.kv_delete_tenant(slug)
    worker.assert_alive()


@pytest.fixture(scope="module")
def shared_stack_worker(gpu_worker_process: RunningWorker) -> Iterator[RunningWorker]:
    """The session's worker on the tiny model, as a module's ``stack_worker``."""
    yield from _lent(gpu_worker_process)


@pytest.fixture(scope="module")
def shared_real_model_worker(default_model_worker: RunningWorker) -> Iterator[RunningWorker]:
    """The session's worker on the real default model (float32), as a module's ``stack_worker``."""
    yield from _lent(default_model_worker)


@pytest.fixture
def stack_env() -> dict[str, str]:
    """Extra environment of the stack's processes; none by default."""
    return {}


@pytest.fixture
def stack_concurrency() -> int | None:
    """Runs the stack's Celery worker executes at once; ``None``: one (``--pool solo``)."""
    return None


@pytest.fixture
def stack(
    stack_worker, stack_env, stack_concurrency, sandbox_image, settings, monkeypatch, request
) -> Iterator[StackURL]:
    """Yields the base URL of the API; runs go through Celery to ``stack_worker``."""
    db = settings.DATABASES["default"]
    # The worker's own name, as in production: runs record it, and the reaper finds its heartbeat.
    name = stack_worker.name
    env = {
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "SYMPHONY_WORKER_NAME": name,
        "SYMPHONY_WORKER_ADMIN_SOCKET": stack_worker.admin_socket,
        "SYMPHONY_SESSIONS_DIR": stack_worker.sessions_dir,
        "SYMPHONY_SANDBOX_IMAGE": sandbox_image,
        # Heartbeats of other workers on this machine must not pull the test's runs elsewhere.
        "SYMPHONY_ROUTING": "static",
        **stack_env,
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings.SYMPHONY_WORKER_NAME = name
    settings.SYMPHONY_ROUTING = "static"
    url = StackURL(request.getfixturevalue("api_asgi_server"))
    url.queue, url.env = f"worker.{name}", env
    with celery_worker(url.queue, env, stack_concurrency) as url.celery:
        yield url
