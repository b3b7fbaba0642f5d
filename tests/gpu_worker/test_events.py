"""The worker's event publisher against the real Redis (127.0.0.1:6379): a burst of events goes
out in order, each once, in a few script calls (one round trip each); an unreachable Redis drops events
after the retry window without raising."""

from __future__ import annotations

import json
import threading
import time
import uuid

import pytest
import redis

from gpu_worker import events as events_module
from gpu_worker.contracts import MessageEvent, TokenEvent, encode, run_stream_key
from gpu_worker.events import EventPublisher
from tests.conftest import redis_db_url

REDIS_URL = redis_db_url(0)


@pytest.fixture
def client() -> redis.Redis:
    return redis.Redis.from_url(REDIS_URL)


def _exec_calls(client: redis.Redis) -> int:
    """Script calls so far: the publisher sends each batch as one (gpu_worker/stream_ledger.py)."""
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in ("evalsha", "eval"))


def _wait_published(publisher: EventPublisher, n: int, timeout: float = 10.0) -> None:
    until = time.monotonic() + timeout
    while publisher.published < n and time.monotonic() < until:
        time.sleep(0.01)
    assert publisher.published == n, (publisher.published, publisher.dropped)


def test_a_burst_of_events_arrives_in_order_once_in_few_round_trips(client: redis.Redis) -> None:
    runs = [f"test-events-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    per_run = 200
    publisher = EventPublisher(REDIS_URL)
    execs_before = _exec_calls(client)
    try:
        for i in range(per_run):
            for run in runs:
                publisher.publish(run, "tenant:events", TokenEvent(f"{run}:{i}"))
        _wait_published(publisher, per_run * len(runs))
        execs = _exec_calls(client) - execs_before
        for run in runs:
            entries = client.xrange(run_stream_key(run))
            texts = [json.loads(fields[b"data"])["text"] for _, fields in entries]
            assert texts == [f"{run}:{i}" for i in range(per_run)]
            assert all(fields[b"type"] == b"token" for _, fields in entries)
    finally:
        publisher.close()
        client.delete(*[run_stream_key(run) for run in runs])
    # 600 events queued faster than one round trip: sent in batches, far fewer than one per
    # event. (Other processes' workers may call scripts meanwhile, hence the margin.)
    assert 1 <= execs <= per_run * len(runs) // 4, execs


def test_unreachable_redis_drops_events_after_the_retry_window_without_raising(monkeypatch) -> None:
    monkeypatch.setattr(events_module, "RETRY_FOR_S", 0.3)
    publisher = EventPublisher("redis://127.0.0.1:1/0")  # nothing listens on port 1
    try:
        for i in range(5):
            publisher.publish("test-events-down", "tenant:events", TokenEvent(str(i)))
        publisher.heartbeat("test-events-down", {"ok": True})
        until = time.monotonic() + 10
        while publisher.dropped < 5 and time.monotonic() < until:
            time.sleep(0.05)
        assert publisher.dropped == 5 and publisher.published == 0
    finally:
        publisher.close()


def test_close_flushes_what_is_queued(client: redis.Redis) -> None:
    run = f"test-events-{uuid.uuid4().hex[:8]}"
    publisher = EventPublisher(REDIS_URL)
    for i in range(50):
        publisher.publish(run, "tenant:events", MessageEvent(i))
    publisher.close(timeout=10)
    try:
        assert publisher.published == 50
        assert client.xlen(run_stream_key(run)) == 50
    finally:
        client.delete(run_stream_key(run))


def test_a_sender_that_stops_waiting_leaves_the_publisher_working(client: redis.Redis, monkeypatch) -> None:
    """A LIP's ``send_to_user`` near its account's share waits on the send's future; when the
    connection closes under it (a cancelled run) the wait is cancelled, and with it the future.
    The publisher then settling that future must not end its thread: every later event of every
    run on the worker (tokens, ``kv``, the answers' text) would be lost."""
    run = f"test-events-{uuid.uuid4().hex[:8]}"
    publisher = EventPublisher(REDIS_URL)
    real_xadd_all = publisher._xadd_all
    cancelled = threading.Event()

    def xadd_after_the_cancel(events):
        cancelled.wait(10)
        return real_xadd_all(events)

    monkeypatch.setattr(publisher, "_xadd_all", xadd_after_the_cancel)
    try:
        outcome = publisher.send(run, "tenant:events-cancel", *encode(MessageEvent("first")))
        assert outcome is not None, "an account's first send waits: its room is not known yet"
        outcome.cancel()
        cancelled.set()
        publisher.publish(run, "tenant:events-cancel", MessageEvent("after"))
        _wait_published(publisher, 2)
        texts = [json.loads(fields[b"data"])["data"] for _, fields in client.xrange(run_stream_key(run))]
        assert texts == ["first", "after"]
    finally:
        publisher.close()
        client.delete(run_stream_key(run))
