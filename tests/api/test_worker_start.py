"""An executor holds a run for a worker that says it is starting (api/services/worker_start.py)
instead of failing it over as dead, and stops holding it when the socket appears, the worker
stops saying so, the run is cancelled, or the bound passes. Real PostgreSQL and Redis (a
private database); the starting key is written in the worker's own format (gpu_worker/contracts.py).
The whole path with a real worker restarting under the stack: tests/reliability/test_worker_starting.py."""

from __future__ import annotations

import json
import threading
import time

import pytest
import redis

from api.models import Program, Run
from api.services import programs, worker_start
from api.services.execution import execute_run
from api.services.runs import cancel_run, create_run
from gpu_worker import contracts

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def starting(worker_heartbeats, settings, tmp_path):
    """Worker ``coming`` says it is starting; its admin socket path does not exist yet."""
    settings.SYMPHONY_WORKER_NAME = "coming"
    settings.SYMPHONY_WORKER_ADMIN_SOCKET = str(tmp_path / "admin.sock")
    settings.SYMPHONY_ROUTING = "static"
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.set(contracts.starting_key("coming"), f"{time.time():.3f}", ex=contracts.HEARTBEAT_TTL_S)
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    yield client
    client.delete(contracts.starting_key("coming"))
    broker.delete("worker.coming")  # the task a re-route past the bound sent


@pytest.fixture
def queued_run(api_tenant_a):
    program = Program.objects.create(tenant=api_tenant_a.tenant, name="p")
    programs.add_version(program, "p.py", b"def main(a):\n    return 1\n")
    run, _ = create_run(api_tenant_a.tenant, program, None, {}, {})
    Run.objects.filter(pk=run.pk).update(worker="coming")
    return run


def _later(seconds: float, action) -> threading.Timer:
    timer = threading.Timer(seconds, action)
    timer.start()
    return timer


def test_the_wait_ends_when_the_admin_socket_appears(starting, queued_run, settings, tmp_path):
    socket = tmp_path / "admin.sock"
    _later(1.2, socket.touch)
    began = time.monotonic()
    worker_start.wait_for_start(str(queued_run.pk), "coming", str(socket))
    assert 1.1 <= time.monotonic() - began < 3
    queued_run.refresh_from_db()
    assert queued_run.status == "queued"  # held, not started, re-routed or failed
    # Whoever follows the run is told why it stays queued.
    events = starting.xrange(contracts.run_stream_key(queued_run.pk))
    said = [json.loads(fields[b"data"]) for _, fields in events if fields[b"type"] == b"status"]
    assert said == [
        {"status": "queued", "reason": "waiting for gpu_worker 'coming' to finish starting (loading the model)"}
    ]


def test_a_worker_that_is_not_starting_is_not_waited_for(starting, queued_run, tmp_path):
    starting.delete(contracts.starting_key("coming"))
    began = time.monotonic()
    worker_start.wait_for_start(str(queued_run.pk), "coming", str(tmp_path / "admin.sock"))
    assert time.monotonic() - began < 0.2


def test_the_wait_ends_when_the_worker_stops_saying_it_starts(starting, queued_run, tmp_path):
    _later(0.5, lambda: starting.delete(contracts.starting_key("coming")))
    began = time.monotonic()
    worker_start.wait_for_start(str(queued_run.pk), "coming", str(tmp_path / "admin.sock"))
    assert time.monotonic() - began < worker_start.RUN_CHECK_S + 1


def test_the_wait_ends_when_the_run_is_cancelled(starting, queued_run, tmp_path):
    _later(0.5, lambda: cancel_run(Run.objects.get(pk=queued_run.pk)))
    began = time.monotonic()
    worker_start.wait_for_start(str(queued_run.pk), "coming", str(tmp_path / "admin.sock"))
    assert time.monotonic() - began < worker_start.RUN_CHECK_S + 1


def test_past_the_bound_the_run_fails_over_as_before(starting, queued_run, settings):
    settings.SYMPHONY_WORKER_START_WAIT_S = 1.0
    began = time.monotonic()
    # The executor's own entry point: it waited the bound, then found no worker and re-routed.
    assert execute_run(str(queued_run.pk), target="coming") == "rerouted"
    assert time.monotonic() - began >= 1.0
    queued_run.refresh_from_db()
    assert queued_run.status == "queued"
