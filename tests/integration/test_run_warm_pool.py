"""Runs through the whole stack with the warm sandbox pool on (``SYMPHONY_SANDBOX_POOL_SIZE``):
API -> Celery -> a pre-started gVisor container -> worker session -> result. The first run of
the Celery process starts the pool and takes the cold path; once a slot is ready, later runs
are handed to it: Docker creates no run container for them, only the pool's refill slot."""

from __future__ import annotations

import time

import pytest

from sandbox.spec import LABEL_OWNER, LABEL_POOL
from tests.conftest import container_names, wait_for
from tests.plugins.worker import RunningWorker

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.integration,
    pytest.mark.docker,
    pytest.mark.vllm,
]

LIP = b"""
from symphony import kv_create, pred, send_to_user


def main(args):
    dist = pred(kv_create(), [11, 12, 13])[-1]
    send_to_user("warm")
    return {"n": args["n"], "top": dist.argmax()}
"""


@pytest.fixture(scope="module")
def stack_worker(shared_stack_worker: RunningWorker) -> RunningWorker:
    return shared_stack_worker


@pytest.fixture
def stack_env() -> dict[str, str]:
    return {"SYMPHONY_SANDBOX_POOL_SIZE": "1"}


def _run(client, program_id: str, n: int) -> dict:
    run = client.create_run(program_id, args={"n": n}, limits={"deadline_s": 60})
    events = list(client.events(run["id"]))
    assert [e.type for e in events][-1] == "end"
    final = client.get_run(run["id"])
    assert final["status"] == "succeeded", final["error"]
    return final


def _pool_containers(docker_client) -> list[str]:
    return container_names(docker_client, include_stopped=False, label=f"{LABEL_POOL}=1")


def test_runs_are_handed_to_prestarted_containers(stack, api_tenant_a, docker_client, tmp_path):
    from symphony_client import Client

    lip = tmp_path / "warm.py"
    lip.write_bytes(LIP)
    client = Client(stack, api_tenant_a.key_secret, timeout=60)
    program = client.upload_program(lip, name="warm")

    first = _run(client, program["id"], 1)  # starts the Celery process's pool
    wait_for(lambda: len(_pool_containers(docker_client)) >= 1, 90, message="a warm pool container")
    time.sleep(2.0)  # the slot's runner connects to its control socket once Python has started

    since = int(time.time()) - 1
    second = _run(client, program["id"], 2)
    created = docker_client.events(
        since=since, until=int(time.time()) + 1, filters={"type": "container", "event": "create"}, decode=True
    )
    labels = [e["Actor"]["Attributes"] for e in created]
    run_containers = [a for a in labels if LABEL_OWNER in a and a.get(LABEL_POOL) != "1"]
    assert any(a.get(LABEL_POOL) == "1" for a in labels), "the used slot was not replaced"
    assert run_containers == [], f"the second run took the cold path: {run_containers}"
    assert second["result"] == {"n": 2, "top": first["result"]["top"]}
