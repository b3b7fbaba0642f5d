"""Fault injection: dockerd restarts while a run's sandbox is executing.

dockerd stops the run's gVisor container on its way down. The run must end (not hang) with an
error that says the sandbox was lost, its usage billed; the container, which the launcher could
not remove while dockerd was down, must be reaped by the Celery worker's periodic reaper once
dockerd is back; and the next run must succeed on the restarted dockerd. The test restarts the
machine's own dockerd (``scripts/bootstrap.sh services`` starts it again, as `make` does) and
always leaves it running.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
import redis
from django.conf import settings

from tests.conftest import ROOT, container_names, wait_for
from tests.plugins.worker import RunningWorker

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.integration,
    pytest.mark.docker,
    pytest.mark.vllm,
]

SLOW_LIP = b"""
from symphony import send_to_user, sleep


def main(args):
    for step in range(args.get("steps", 600)):
        send_to_user(f"step {step}")
        sleep(0.05)
    return {"finished": True}
"""
DOCKER_PID_FILE = Path("/var/run/docker.pid")


@pytest.fixture(scope="module")
def stack_worker(shared_stack_worker: RunningWorker) -> RunningWorker:
    return shared_stack_worker


@pytest.fixture
def stack_env() -> dict[str, str]:
    # Reap often and soon, so the test need not wait the production minute.
    return {"SYMPHONY_SANDBOX_REAP_EVERY_S": "2", "SYMPHONY_SANDBOX_EXITED_GRACE_S": "3"}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()


def _start_dockerd() -> None:
    proc = subprocess.run(
        [str(ROOT / "scripts" / "bootstrap.sh"), "services"], capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, f"dockerd did not come back: {proc.stdout[-2000:]}{proc.stderr[-2000:]}"


def _stop_dockerd() -> None:
    if not DOCKER_PID_FILE.is_file():
        pytest.fail(f"{DOCKER_PID_FILE} not found: this test restarts the dockerd that `make` started")
    pid = int(DOCKER_PID_FILE.read_text().strip())
    os.kill(pid, signal.SIGTERM)
    wait_for(lambda: not _alive(pid), 120, interval=0.5, message="dockerd to stop")


def _stream(run_id: str) -> list[bytes]:
    events = redis.Redis.from_url(settings.REDIS_URL)
    return [f.get(b"data", b"") for _, f in events.xrange(f"run:{run_id}")]


def test_dockerd_restart_fails_the_run_clearly_and_leaks_nothing(stack, api_tenant_a, docker_client, tmp_path):
    from api.models import Run, UsageRecord
    from sandbox.spec import LABEL_RUN
    from symphony_client import Client

    lip = tmp_path / "slow.py"
    lip.write_bytes(SLOW_LIP)
    client = Client(stack, api_tenant_a.key_secret, timeout=60)
    program = client.upload_program(lip, name="slow")
    run_id = client.create_run(program["id"], args={}, limits={"deadline_s": 120})["id"]
    wait_for(lambda: any(b"step 3" in d for d in _stream(run_id)), 90, message="the LIP to stream a few steps")

    try:
        _stop_dockerd()
    finally:
        _start_dockerd()

    wait_for(lambda: Run.objects.get(pk=run_id).status in Run.TERMINAL, 120, message="the run to end")
    run = Run.objects.get(pk=run_id)
    assert run.status == "failed", (run.status, run.error)
    assert run.error, "the run failed without saying why"
    assert UsageRecord.objects.filter(run_id=run_id).exists()

    import docker

    fresh = docker.from_env(timeout=60)
    wait_for(
        lambda: not container_names(fresh, label=f"{LABEL_RUN}={run_id}"),
        60,
        interval=1.0,
        message="the run's stopped container to be reaped",
    )
    again = client.create_run(program["id"], args={"steps": 2}, limits={"deadline_s": 60})["id"]
    list(client.events(again))
    assert client.get_run(again)["status"] == "succeeded", client.get_run(again)["error"]
