"""Fault injection: the gpu_worker is killed (SIGKILL) in the middle of a run.

The run must end ``failed`` with an error that names the lost worker (not hang, not succeed),
its usage row must exist with the sandbox time billed, the sandbox container must be gone,
and a worker started again must come back healthy.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from django.conf import settings

from tests.conftest import container_names, wait_for
from tests.plugins.worker import RunningWorker, start_worker

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.integration,
    pytest.mark.docker,
    pytest.mark.vllm,
]

SLOW_LIP = b"""
from symphony import kv_create, pred, send_to_user, sleep


def main(args):
    kv = kv_create()
    dist = pred(kv, [1, 2, 3])[-1]
    for step in range(400):
        tok = dist.argmax()
        send_to_user(f"step {step}")
        sleep(0.05)
        dist = pred(kv, [tok])[-1]
    return {"finished": True}
"""


@pytest.fixture
def stack_worker(tiny_model_dir: Path) -> Iterator[RunningWorker]:
    """A private worker this test may kill."""
    with start_worker(tiny_model_dir, name="victim") as worker:
        yield worker


def test_killed_worker_fails_the_run_clearly_and_bills_it(stack, stack_worker, api_tenant_a, docker_client, tmp_path):
    from api.models import Run, UsageRecord
    from sandbox.spec import LABEL_RUN
    from symphony_client import Client

    lip = tmp_path / "slow.py"
    lip.write_bytes(SLOW_LIP)
    client = Client(stack, api_tenant_a.key_secret, timeout=60)
    program = client.upload_program(lip, name="slow")
    run_id = client.create_run(program["id"], args={}, limits={"deadline_s": 60})["id"]

    events = redis.Redis.from_url(settings.REDIS_URL)
    wait_for(
        lambda: any(b"step 3" in f.get(b"data", b"") for _, f in events.xrange(f"run:{run_id}")),
        timeout=90,
        message="the LIP to stream a few steps",
    )
    stack_worker.proc.send_signal(signal.SIGKILL)
    stack_worker.proc.wait(timeout=10)

    def finished() -> bool:
        return Run.objects.get(pk=run_id).status in Run.TERMINAL

    wait_for(finished, timeout=60, message="the run to end after the worker died")
    run = Run.objects.get(pk=run_id)
    assert run.status == "failed", (run.status, run.error)
    assert "became unreachable during the run" in run.error, run.error
    assert run.result is None
    usage = UsageRecord.objects.get(run_id=run_id)
    assert usage.sandbox_seconds > 0
    time.sleep(1)
    leftovers = container_names(docker_client, label=f"{LABEL_RUN}={run_id}")
    assert leftovers == [], leftovers

    with start_worker(stack_worker.model_dir, name="victim-restarted") as again:
        again.assert_alive()
