"""``make up``'s process list (scripts/run_stack.py): ``SYMPHONY_WORKERS=N`` gives N workers, each
with its own admin socket, sessions directory and Celery executor on its own queue."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def run_stack():
    spec = importlib.util.spec_from_file_location("run_stack", ROOT / "scripts" / "run_stack.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["run_stack"] = module  # dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("run_stack", None)


def _by_name(run_stack) -> dict:
    return {s.name: s for s in run_stack.services()}


def test_one_worker_by_default_consumes_the_shared_queue_too(run_stack, monkeypatch):
    monkeypatch.delenv("SYMPHONY_WORKERS", raising=False)
    monkeypatch.setenv("SYMPHONY_WORKER_NAME", "local")
    services = _by_name(run_stack)
    assert [n for n in services if n.startswith(("gpu_worker", "celery"))] == ["gpu_worker", "celery", "celery-beat"]
    celery = services["celery"].argv
    assert celery[celery.index("-Q") + 1] == "symphony,worker.local"
    assert services["gpu_worker"].env_overrides == {}


def test_two_workers_each_get_their_own_socket_sessions_and_queue(run_stack, monkeypatch):
    monkeypatch.setenv("SYMPHONY_WORKERS", "2")
    monkeypatch.setenv("SYMPHONY_WORKER_NAME", "local")
    monkeypatch.setenv("SYMPHONY_WORKER_ADMIN_SOCKET", "/elsewhere/admin.sock")  # the first worker's
    services = _by_name(run_stack)
    second, executor = services["gpu_worker-local-2"], services["celery-local-2"]
    assert second.argv[second.argv.index("--name") + 1] == "local-2"
    socket = second.argv[second.argv.index("--admin-socket") + 1]
    assert socket.endswith("var/run/local-2/admin.sock")
    assert executor.env_overrides == second.env_overrides
    assert executor.env_overrides["SYMPHONY_WORKER_ADMIN_SOCKET"] == socket  # wins over the caller's
    assert executor.env_overrides["SYMPHONY_SESSIONS_DIR"].endswith("var/run/local-2/sessions")
    assert executor.argv[executor.argv.index("-Q") + 1] == "worker.local-2"  # not the shared queue
    assert "--kv-store" not in second.argv  # both on SYMPHONY_KV_STORE: one store


@pytest.mark.parametrize("bad", ["0", "two", "-1", "17"])
def test_a_bad_worker_count_is_a_clear_error(run_stack, monkeypatch, bad):
    monkeypatch.setenv("SYMPHONY_WORKERS", bad)
    with pytest.raises(SystemExit, match="SYMPHONY_WORKERS must be a number of local workers from 1 to 16"):
        run_stack.services()


def test_each_executor_announces_itself_for_its_own_worker_only(run_stack, monkeypatch):
    """Routing needs each worker's executor (api/services/executor_presence.py): the executor of
    ``local`` also consumes the shared queue, but announces itself for ``local`` alone."""
    from api.services.executor_presence import workers_of_queues

    monkeypatch.setenv("SYMPHONY_WORKERS", "2")
    monkeypatch.setenv("SYMPHONY_WORKER_NAME", "local")
    services = _by_name(run_stack)
    for executor, worker in (("celery", "local"), ("celery-local-2", "local-2")):
        argv = services[executor].argv
        assert workers_of_queues(argv[argv.index("-Q") + 1].split(",")) == [worker]
