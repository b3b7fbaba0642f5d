"""Fault injection: every PostgreSQL connection of the stack is terminated in the middle of a run
(as a database restart, failover or idle-connection kill does).

The run must still end ``succeeded`` with its result and usage written (the executor re-opens
its connection to record the outcome instead of losing it with the task), and the API must keep
answering on fresh connections.
"""

from __future__ import annotations

import pytest
import redis
from django.conf import settings
from django.db import connection

from tests.conftest import wait_for
from tests.plugins.worker import RunningWorker

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.integration,
    pytest.mark.docker,
    pytest.mark.vllm,
]

LIP = b"""
from symphony import send_to_user, sleep


def main(args):
    send_to_user("started")
    sleep(args["seconds"])
    return {"slept": args["seconds"]}
"""


@pytest.fixture(scope="module")
def stack_worker(shared_stack_worker: RunningWorker) -> RunningWorker:
    return shared_stack_worker


def _terminate_other_connections() -> int:
    """pg_terminate_backend on every other session of the test database; returns how many."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return cursor.fetchone()[0]


def test_run_survives_its_database_connections_being_killed(stack, api_tenant_a, tmp_path):
    from api.models import Run, UsageRecord
    from symphony_client import Client

    lip = tmp_path / "sleepy.py"
    lip.write_bytes(LIP)
    client = Client(stack, api_tenant_a.key_secret, timeout=60)
    program = client.upload_program(lip, name="sleepy")
    run_id = client.create_run(program["id"], args={"seconds": 6}, limits={"deadline_s": 60})["id"]
    events = redis.Redis.from_url(settings.REDIS_URL)
    wait_for(
        lambda: any(b"started" in f.get(b"data", b"") for _, f in events.xrange(f"run:{run_id}")),
        timeout=90,
        message="the LIP to start",
    )
    assert _terminate_other_connections() >= 1, "the executor held no connection to kill"

    wait_for(lambda: Run.objects.get(pk=run_id).status in Run.TERMINAL, 60, message="the run to end")
    run = Run.objects.get(pk=run_id)
    assert (run.status, run.result) == ("succeeded", {"slept": 6}), (run.status, run.error)
    assert UsageRecord.objects.get(run_id=run_id).sandbox_seconds > 0
    assert client.get_run(run_id)["status"] == "succeeded"  # the API process reconnected too
