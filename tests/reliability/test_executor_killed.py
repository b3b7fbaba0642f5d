"""Fault injection: the Celery worker executing a run is killed (SIGKILL) mid-run.

The gpu_worker stays alive, so only the executor heartbeat (api/services/executor_liveness.py)
tells that the run lost its executor. The reaper must fail the run with a clear error within
seconds instead of leaving it ``running`` until the broker's visibility timeout; the LIP must
have executed exactly once; a Celery worker started again on the queue removes the orphaned
sandbox container, and the next run on it succeeds.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from django.conf import settings

from tests.conftest import celery_worker, container_names, wait_for
from tests.plugins.worker import RunningWorker, start_worker

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.integration,
    pytest.mark.docker,
    pytest.mark.vllm,
]

SLOW_LIP = b"""
from symphony import send_to_user, sleep


def main(args):
    send_to_user("started")
    for step in range(args.get("steps", 600)):
        send_to_user(f"step {step}")
        sleep(0.05)
    return {"finished": True}
"""


@pytest.fixture(scope="module")
def stack_worker(tiny_model_dir: Path) -> Iterator[RunningWorker]:
    with start_worker(tiny_model_dir, name="executor-victim") as worker:
        yield worker


def _stream(run_id: str) -> list[bytes]:
    events = redis.Redis.from_url(settings.REDIS_URL)
    return [f.get(b"data", b"") for _, f in events.xrange(f"run:{run_id}")]


def test_killed_executor_fails_the_run_once_and_clearly(stack, api_tenant_a, docker_client, monkeypatch, tmp_path):
    from api.models import Run
    from api.services import executor_liveness, runs
    from sandbox.spec import LABEL_RUN
    from symphony_client import Client

    lip = tmp_path / "slow.py"
    lip.write_bytes(SLOW_LIP)
    client = Client(stack, api_tenant_a.key_secret, timeout=60)
    program = client.upload_program(lip, name="slow")
    run_id = client.create_run(program["id"], args={}, limits={"deadline_s": 120})["id"]
    wait_for(lambda: any(b"step 3" in d for d in _stream(run_id)), 90, message="the LIP to stream a few steps")

    stack.celery.send_signal(signal.SIGKILL)
    stack.celery.wait(timeout=10)
    # The run's executor heartbeat expires within its TTL; the reaper (Celery beat in production)
    # is called here directly, with the grace period shortened to what this test can wait for.
    monkeypatch.setattr(runs, "EXECUTOR_GRACE_S", 0)
    assert Run.objects.get(pk=run_id).status == "running"
    wait_for(
        lambda: runs.reap_orphaned_runs()["failed"] == 1,
        timeout=executor_liveness.TTL_S + 15,
        interval=1.0,
        message="the reaper to fail the run of the dead executor",
    )
    run = Run.objects.get(pk=run_id)
    assert run.status == "failed" and "Celery executor" in run.error, (run.status, run.error)
    assert sum(b'"started"' in d for d in _stream(run_id)) == 1, "the LIP started more than once"

    # A Celery worker starting on the queue reaps the sandbox whose launcher process is gone.
    with celery_worker(stack.queue, stack.env):
        wait_for(
            lambda: not container_names(docker_client, label=f"{LABEL_RUN}={run_id}"),
            timeout=60,
            message="the orphaned sandbox container to be reaped",
        )
        again = client.create_run(program["id"], args={"steps": 2}, limits={"deadline_s": 60})["id"]
        list(client.events(again))
        assert client.get_run(again)["status"] == "succeeded"
    assert Run.objects.get(pk=run_id).status == "failed"  # the redelivered task, if any, did not rerun it
