"""Runs and ``/v1`` requests sent while the gpu_worker starts wait for it and succeed.

A fresh ``make up`` prints its banner (and the web answers) minutes before the worker has
loaded and compiled the model. The executor used to take the missing admin socket for a dead
worker: three re-routes seconds apart, then the run failed, and a chat request got a 500. The
worker now says it is starting (gpu_worker/start_beacon.py) and the executor holds the run,
still queued, until the socket is there (api/services/worker_start.py).

Here the stack's worker is killed and started again (a supervisor's restart; a fresh start is
the same with nothing before it); a REST run and a chat request are sent while it starts, and
both must succeed once it answers, started no earlier than that.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from django.conf import settings

from gpu_worker import contracts
from tests.conftest import wait_for
from tests.integration.openai_support import openai_client
from tests.plugins.worker import RunningWorker, await_healthy, start_worker

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.integration,
    pytest.mark.docker,
    pytest.mark.vllm,
    pytest.mark.timeout(600),
]

LIP = b"""
from symphony import kv_create, pred


def main(args):
    kv = kv_create()
    return {"next": pred(kv, [1, 2, 3])[-1].argmax()}
"""


@pytest.fixture
def stack_worker(tiny_model_dir: Path) -> Iterator[RunningWorker]:
    """A private worker this test restarts."""
    with start_worker(tiny_model_dir, name="restarting") as worker:
        yield worker


def test_a_run_and_a_chat_request_sent_while_the_worker_starts_wait_for_it(stack, stack_worker, api_tenant_a, tmp_path):
    from api.models import Run
    from symphony_client import Client

    client = Client(stack, api_tenant_a.key_secret, timeout=60)
    lip = tmp_path / "next.py"
    lip.write_bytes(LIP)
    program = client.upload_program(lip, name="next")

    stack_worker.proc.send_signal(signal.SIGKILL)
    stack_worker.proc.wait(timeout=10)
    stack_worker.relaunch()
    beacons = redis.Redis.from_url(settings.REDIS_URL)
    key = contracts.starting_key(stack_worker.name)
    wait_for(lambda: beacons.exists(key), timeout=60, message="the restarted worker to say it is starting")
    assert not os.path.exists(stack_worker.admin_socket), "the old worker's socket was not cleared"

    answers: dict[str, object] = {}

    def chat() -> None:
        try:
            answers["chat"] = openai_client(stack, api_tenant_a.key_secret).chat.completions.create(
                model="symphony", messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0
            )
        except Exception as exc:  # reported below
            answers["chat"] = exc

    sent_at = time.time()
    run_id = client.create_run(program["id"], args={}, limits={"deadline_s": 60})["id"]
    asker = threading.Thread(target=chat)
    asker.start()
    time.sleep(3)  # past the old failover's three re-routes of 0.5, 1 and 2 s
    still_starting = not os.path.exists(stack_worker.admin_socket)
    assert Run.objects.get(pk=run_id).status == "queued"

    await_healthy(stack_worker)
    ready_at = time.time()
    assert not beacons.exists(key), "a ready worker still says it is starting"
    asker.join(timeout=240)
    run = client.wait(run_id, timeout=120)
    assert run["status"] == "succeeded", run
    assert isinstance(run["result"]["next"], int), run
    chat_answer = answers["chat"]
    assert not isinstance(chat_answer, Exception), repr(chat_answer)
    assert chat_answer.choices[0].message.role == "assistant"
    started = Run.objects.get(pk=run_id).started_at
    assert started is not None and started.timestamp() >= ready_at - 2.0, (started, ready_at)
    # The worker came up after both were sent: they waited, not ran on a worker already back.
    assert still_starting and ready_at - sent_at > 3, (still_starting, ready_at - sent_at)
