"""One account cannot fill Redis with retained run event streams (the isolation issue's "6 runs
added 97 MB in ~7 s; ~30 runs reach the 512 MB noeviction ceiling, and then Redis refuses the
Celery broker, leases and rate counters for everyone").

A private Redis with a small ``maxmemory`` (``noeviction``, as every deployment runs it) and a
real worker on it, whose pool for streams is that memory less an 8 MiB headroom
(gpu_worker/stream_ledger.py). Real LIPs in gVisor of two tenants of ONE account flood it with
~200 KB messages: the second run stops with EDQUOT naming the account-wide bound and the plan's
limit, with the account's streams held at its share; another account's run then still streams
every message and succeeds, and Redis stays below ``maxmemory`` with room for a broker write.
The ledger gives the bytes back when the streams expire (the publisher alone, on the same
Redis: a short TTL).

Bounded: at most ~40 MiB streamed in all, three LIP runs.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from gpu_worker import contracts, stream_ledger
from gpu_worker.events import EventPublisher
from gpu_worker.stream_ledger import StreamBudget
from tests.conftest import wait_for
from tests.plugins.browser import free_port
from tests.plugins.sandbox import LIPRunner
from tests.plugins.worker import RunningWorker, start_worker

pytestmark = [pytest.mark.integration, pytest.mark.docker, pytest.mark.vllm, pytest.mark.timeout(300)]

MIB = 1024 * 1024
MAXMEMORY = 48 * MIB
HEADROOM = 8 * MIB
POOL = StreamBudget(headroom_bytes=HEADROOM).pool(MAXMEMORY)
#: Per run: the plan's stream_bytes_per_run (the free plan's 16 MiB).
RUN_BUDGET = 16 * MIB
CHARS = 100_000

FLOOD = """
from symphony import QuotaExceeded, send_to_user


def main(args):
    out = {"sent": 0}
    try:
        for _ in range(args["most"]):
            send_to_user("\u00e9" * args["chars"])
            out["sent"] += 1
    except QuotaExceeded as exc:
        out["over"] = str(exc)
    return out
"""


def _ping(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


@pytest.fixture(scope="module")
def small_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A redis-server of ``MAXMEMORY`` that refuses writes when full, as deployments run it."""
    port = free_port()
    flags = ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    flags += ["--maxmemory", str(MAXMEMORY), "--maxmemory-policy", "noeviction"]
    proc = subprocess.Popen(["redis-server", *flags, "--dir", str(tmp_path_factory.mktemp("redis"))])
    try:
        wait_for(lambda: _ping(redis.Redis(port=port)), 10, message="redis-server")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="module")
def small_redis_worker(tiny_model_dir: Path, small_redis: str) -> Iterator[RunningWorker]:
    args = ["--redis-headroom-bytes", str(HEADROOM)]
    with start_worker(tiny_model_dir, name="stream-share", redis_url=small_redis, extra_args=args) as worker:
        yield worker


def _stored_bytes(client: redis.Redis, run_id: str) -> int:
    entries = client.xrange(f"run:{run_id}")
    return sum(len(f[b"type"]) + len(f[b"data"]) for _, f in entries if f[b"type"] == b"token")


def test_one_accounts_streams_stop_at_its_share_and_another_tenant_still_streams(
    small_redis: str, small_redis_worker: RunningWorker, launcher
):
    runner = LIPRunner(small_redis_worker, launcher)
    client = redis.Redis.from_url(small_redis)
    account = f"u{uuid.uuid4().int % 10**6}"
    limits = {"max_stream_bytes": RUN_BUDGET, "account": account}
    message = len("token") + len(f'{{"text": "{"é" * CHARS}"}}'.encode())

    # Two tenants of one account: the first run ends at its own plan budget, the second at the
    # account's share of Redis (alone, the pool's ceiling), not at its plan budget.
    first = runner.run(FLOOD, {"chars": CHARS, "most": 200}, tenant="share-a1", session_limits=limits).result
    assert first.status == "succeeded", (first.error, first.stderr[-2000:])
    assert "stream_bytes_per_run" in first.result["over"] and "max_stream_bytes" not in first.result["over"]
    assert first.result["sent"] == RUN_BUDGET // message
    second_id = f"share-{uuid.uuid4().hex[:8]}"
    second = runner.run(
        FLOOD, {"chars": CHARS, "most": 200}, tenant="share-a2", session_limits=limits, run_id=second_id
    )
    res = second.result
    assert res.status == "succeeded", (res.error, res.stderr[-2000:])
    over = res.result["over"]
    assert "Redis bound on retained event streams" in over and "stream_bytes_per_run" in over, over
    assert str(POOL.ceiling) in over, over
    assert res.result["sent"] < RUN_BUDGET // message  # stopped before its own plan budget
    time.sleep(0.5)  # the worker publishes on a background thread
    held = int(client.hget(stream_ledger.KEYS[3], account) or 0)
    assert POOL.ceiling - stream_ledger.stored_cost(message) < held <= POOL.ceiling, (held, POOL.ceiling)
    assert _stored_bytes(client, second_id) == res.result["sent"] * message  # nothing past the bound

    # Another account still streams every message and finishes; Redis has room for the broker.
    canary = runner.run(
        FLOOD,
        {"chars": CHARS, "most": 20},
        tenant="share-other",
        session_limits={"max_stream_bytes": RUN_BUDGET, "account": f"{account}-other"},
    ).result
    assert canary.status == "succeeded" and canary.result == {"sent": 20}, canary.result
    used = int(client.info("memory")["used_memory"])
    assert used < MAXMEMORY, used
    client.set("symphony:broker-probe", "x" * 65536)  # a broker-sized write still lands
    print(f"stream-share: account held {held} of ceiling {POOL.ceiling}; redis used {used} of {MAXMEMORY}")


def test_the_ledger_gives_bytes_back_when_streams_expire(small_redis: str):
    """Correct under expiry: an account at its share streams again once its streams expire."""
    publisher = EventPublisher(small_redis, StreamBudget(headroom_bytes=HEADROOM, running_ttl_s=2))
    account = f"expiry-{uuid.uuid4().hex[:6]}"
    type_, payload = contracts.encode(contracts.TokenEvent("x" * 500_000))
    try:
        refusal = None
        for i in range(200):
            outcome = publisher.send(f"expiry-{i}", account, type_, payload)
            refusal = outcome.result(10) if outcome is not None else None
            if refusal is not None:
                break
        assert refusal is not None and refusal.limit <= POOL.ceiling, refusal
        time.sleep(2.5)  # every stream of the account has expired
        outcome = publisher.send("expiry-again", account, type_, payload)
        assert outcome is not None and outcome.result(10) is None
    finally:
        publisher.close()
