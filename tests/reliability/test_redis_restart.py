"""Fault injection: Redis (event streams, heartbeats) restarts while a client streams a run.

A private ``redis-server`` with an append-only file stands in for a durable production Redis
(ElastiCache, a replica promoted): the stack's ``REDIS_URL`` points at it, the Celery broker stays
on the machine's Redis. It is shut down mid-run and started again on the same port and data. The
SSE client must receive every token of the run exactly once and in order, through to ``end``:
the worker holds events while Redis is away, the SSE view reconnects and continues after the last
entry it sent, and the client resumes with Last-Event-ID if the server gave up.
"""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.conftest import wait_for
from tests.plugins.worker import RunningWorker, start_worker

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.integration,
    pytest.mark.docker,
    pytest.mark.vllm,
]

TOKENS = 40
LIP = b"""
from symphony import send_to_user, sleep


def main(args):
    for i in range(args["n"]):
        send_to_user(f"tok{i};")
        sleep(0.1)
    return {"sent": args["n"]}
"""


class PrivateRedis:
    """A redis-server on a free port with an AOF in ``data_dir``; restartable on the same port."""

    def __init__(self, data_dir: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.data_dir = data_dir
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        cmd = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        cmd += ["--appendonly", "yes", "--appendfsync", "always", "--dir", str(self.data_dir)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.5)

        def up() -> bool:
            try:
                return bool(client.ping())
            except redis.RedisError:
                return False

        wait_for(up, 20, message=f"redis-server on port {self.port}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: redis-server flushes the AOF and exits
            self.proc.wait(timeout=20)


@pytest.fixture(scope="module")
def private_redis(tmp_path_factory) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path_factory.mktemp("redis"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def stack_worker(tiny_model_dir: Path, private_redis: PrivateRedis) -> Iterator[RunningWorker]:
    with start_worker(tiny_model_dir, name="redis-restart", redis_url=private_redis.url) as worker:
        yield worker


@pytest.fixture
def stack_env(private_redis: PrivateRedis, settings) -> dict[str, str]:
    settings.REDIS_URL = private_redis.url  # this process reads the streams too
    return {"REDIS_URL": private_redis.url}


def test_streaming_client_gets_every_token_once_across_a_redis_restart(stack, private_redis, api_tenant_a, tmp_path):
    from symphony_client import Client

    lip = tmp_path / "counter.py"
    lip.write_bytes(LIP)
    client = Client(stack, api_tenant_a.key_secret, timeout=60)
    program = client.upload_program(lip, name="counter")
    run_id = client.create_run(program["id"], args={"n": TOKENS}, limits={"deadline_s": 120})["id"]

    received: list = []
    reader = threading.Thread(target=lambda: received.extend(client.events(run_id)), daemon=True)
    reader.start()
    wait_for(lambda: sum(e.type == "token" for e in received) >= 5, 90, message="the first tokens")

    private_redis.stop()
    time.sleep(2.0)  # tokens produced meanwhile wait in the worker
    private_redis.start()
    reader.join(timeout=120)
    assert not reader.is_alive(), "the event stream did not reach its end"

    assert received[-1].type == "end" and received[-1].data["status"] == "succeeded", received[-3:]
    text = "".join(e.data["text"] for e in received if e.type == "token")
    assert text == "".join(f"tok{i};" for i in range(TOKENS)), text
    ids = [e.id for e in received]
    assert len(ids) == len(set(ids)), "an event was delivered twice"
