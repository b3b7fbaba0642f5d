"""The web process's asyncio Redis clients (api/redis_client.py): one pooled client per event
loop, a pool that closes what a burst opened past its idle bound, and commands retried once on
a connection Redis dropped (safe because the lease script is idempotent). Against the real Redis."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis

from api import redis_client

BURST = 12
MAX_IDLE = 3


def _named_clients(url: str, name: str) -> int:
    with redis.Redis.from_url(url) as admin:
        return sum(1 for c in admin.client_list() if c.get("name") == name)


def test_a_burst_leaves_at_most_the_idle_bound_open(settings):
    """Twelve blocking reads at once open twelve connections; once they are done, the pool
    keeps three and has closed the rest (redis-py's own pool would keep all twelve)."""
    name = f"idle-bound-{uuid.uuid4().hex[:8]}"

    async def burst() -> tuple[int, int]:
        pool = redis_client.IdleBoundedPool.from_url(settings.REDIS_URL, max_idle=MAX_IDLE, client_name=name)
        client = redis.asyncio.Redis(connection_pool=pool)
        stream = f"test:idle-bound:{name}"
        reads = [asyncio.create_task(client.xread({stream: "0-0"}, block=300)) for _ in range(BURST)]
        await asyncio.sleep(0.15)
        during = _named_clients(settings.REDIS_URL, name)
        await asyncio.gather(*reads)
        after = _named_clients(settings.REDIS_URL, name)
        await pool.disconnect()
        return during, after

    during, after = asyncio.run(burst())
    assert during == BURST
    assert after == MAX_IDLE


def test_one_client_per_loop_and_closed_loops_are_forgotten(settings):
    async def twice() -> tuple[object, object, list]:
        first = redis_client.shared_async(settings.REDIS_URL)
        return first, redis_client.shared_async(settings.REDIS_URL), list(redis_client._async_clients)

    first, again, _ = asyncio.run(twice())
    assert first is again
    other, _, loops = asyncio.run(twice())
    assert other is not first  # a new loop gets its own: asyncio connections belong to their loop
    assert len(loops) == 1  # the first loop, closed, was dropped


def test_the_pooled_client_answers_after_redis_drops_its_connections(settings):
    """A pooled connection Redis closed (restart, ``CLIENT KILL``, idle timeout) is not handed
    out as if alive: the next command reconnects."""
    name = f"idle-kill-{uuid.uuid4().hex[:8]}"

    async def run() -> bytes | None:
        client = redis_client.shared_async(settings.REDIS_URL)
        await client.client_setname(name)
        await client.set(f"test:{name}", "1", ex=10)
        with redis.Redis.from_url(settings.REDIS_URL) as admin:
            for c in admin.client_list():
                if c.get("name") == name:
                    admin.client_kill_filter(_id=c["id"])
        return await client.get(f"test:{name}")

    assert asyncio.run(run()) == b"1"


@pytest.fixture(autouse=True)
def _forget_clients():
    yield
    redis_client._async_clients.clear()


def test_a_repeated_lease_acquire_is_admitted_not_counted_twice(settings):
    """What makes retrying the lease script safe: the same lease id sent again (its first reply
    lost with the connection) is admitted, even with the tenant at its cap."""
    from api.services import stream_leases

    key = f"symphony:streams:test-{uuid.uuid4().hex[:8]}"
    with redis.Redis.from_url(settings.REDIS_URL) as client:
        try:
            assert client.eval(stream_leases._ACQUIRE, 1, key, 1, 30, "lease-1") == 1
            assert client.eval(stream_leases._ACQUIRE, 1, key, 1, 30, "lease-1") == 1
            assert client.eval(stream_leases._ACQUIRE, 1, key, 1, 30, "lease-2") == 0
            assert client.zcard(key) == 1
        finally:
            client.delete(key)
