"""Event streams of one tenant cannot exhaust PostgreSQL or Redis (the hardening issue's
"~300 streams, 500 too many clients, the outage persists").

Against a real uvicorn (ASGI) on the test database and the real Redis, with a low per-tenant
stream cap (``SYMPHONY_STREAMS_PER_TENANT``): tenant A opens more streams at once than the cap
allows; the extra ones get 429 ``throttled`` with ``Retry-After`` (OpenAI's envelope on
``/v1``), the open ones hold no database connection while they wait, tenant B still streams and
reads within a bound, and once the clients are gone the web process is back to the PostgreSQL
connections and Redis clients it had before (give or take its pools' idle bounds), and A may
stream again.

Bounded: ``ATTEMPTS`` streams (well under PostgreSQL's shared ``max_connections``), a few
seconds each, 127.0.0.1 only.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import pytest
import redis
from django.conf import settings
from django.db import connection

from api import redis_client
from api.models import Program, Run
from api.services import programs
from tests.conftest import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration, pytest.mark.timeout(180)]

CAP = 4
ATTEMPTS = 16
CACHE_CONNECTIONS = 4
#: The web process's PostgreSQL pool (``DATABASE_POOL_MAX_SIZE``): one connection, kept open
#: while idle; a stream that held it would leave every other request waiting for the pool (B's
#: canary would miss :data:`CANARY_S`, a key-checked request would time out).
DB_POOL = 1
POOL_TIMEOUT_S = 3
#: B's canary must be answered within this many seconds while A holds its streams.
CANARY_S = 5.0


@pytest.fixture
def capped_server(monkeypatch, request, api_tenant_a, api_tenant_b) -> str:
    """uvicorn with the low caps; the tenants start with no leases (a test database made anew
    reuses tenant ids, whose leases a previous session may have left to expire)."""
    with redis.Redis.from_url(settings.REDIS_URL) as client:
        client.delete(*(f"symphony:streams:{t.tenant.account_key}" for t in (api_tenant_a, api_tenant_b)))
    monkeypatch.setenv("SYMPHONY_STREAMS_PER_TENANT", str(CAP))
    monkeypatch.setenv("SYMPHONY_CACHE_MAX_CONNECTIONS", str(CACHE_CONNECTIONS))
    monkeypatch.setenv("DATABASE_POOL_MAX_SIZE", str(DB_POOL))
    monkeypatch.setenv("DATABASE_POOL_TIMEOUT_S", str(POOL_TIMEOUT_S))
    return request.getfixturevalue("api_asgi_server")


def _queued_run(tenant) -> Run:
    """A run that stays queued (no executor takes it): its event stream waits, as a live one does."""
    program = Program.objects.create(tenant=tenant, name=f"waits-{tenant.slug}")
    version = programs.add_version(program, "p.py", b"def main(a):\n    return 1\n")
    return Run.objects.create(tenant=tenant, program_version=version, args={}, limits={})


def _web_db_connections() -> int:
    """Sessions on the test database other than this test's own."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return cursor.fetchone()[0]


def _redis_clients() -> tuple[int, int]:
    """Clients of Redis's event-stream database (``REDIS_URL``: streams, leases), and of the
    shared cache's (throttle counters: a pool of at most ``CACHE_CONNECTIONS`` per web process)."""
    with redis.Redis.from_url(settings.REDIS_URL) as client:
        clients = client.client_list()
    streams_db = redis.Redis.from_url(settings.REDIS_URL).connection_pool.connection_kwargs.get("db", 0)
    cache_db = redis.Redis.from_url(settings.CACHES["default"]["LOCATION"]).connection_pool.connection_kwargs["db"]
    return sum(int(c["db"]) == streams_db for c in clients), sum(int(c["db"]) == cache_db for c in clients)


def _wait_released(db_before: int, redis_before: tuple[int, int]) -> None:
    """Until the web process is back to its idle connections: PostgreSQL, stream and cache
    clients at most their pools' idle bounds more than before (the asyncio client's pool closes
    what the burst opened past ``ASYNC_MAX_IDLE``; CLIENT LIST also counts this test process's own)."""
    now: dict = {}

    def released() -> bool:
        now["db"], (now["streams"], now["cache"]) = _web_db_connections(), _redis_clients()
        cache_bound = redis_before[1] + CACHE_CONNECTIONS
        streams_bound = redis_before[0] + redis_client.ASYNC_MAX_IDLE
        return now["db"] <= db_before + DB_POOL and now["streams"] <= streams_bound and now["cache"] <= cache_bound

    try:
        wait_for(released, timeout=15, message="the web process's connections to be released")
    except BaseException:
        with redis.Redis.from_url(settings.REDIS_URL) as client:
            open_ = [(c["db"], c["cmd"], c["age"], c["idle"]) for c in client.client_list()]
        pytest.fail(f"before: db={db_before} redis={redis_before}; now: {now}; Redis clients: {open_}")


class Stream:
    """One HTTP request whose response headers were read and whose body is left unread, so the
    connection stays open until :meth:`close` (what a waiting EventSource does)."""

    def __init__(self, base: str, method: str, path: str, secret: str, body: dict | None = None) -> None:
        parts = urlsplit(base)
        self.conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=20)
        headers = {"Authorization": f"Bearer {secret}"}
        payload = None
        if body is not None:
            payload = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        started = time.monotonic()
        self.conn.request(method, path, body=payload, headers=headers)
        self.response = self.conn.getresponse()
        self.seconds = time.monotonic() - started
        self.status = self.response.status
        self.error = json.loads(self.response.read()) if self.status >= 400 else None

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def streams() -> Iterator[list[Stream]]:
    opened: list[Stream] = []
    yield opened
    for stream in opened:
        stream.close()


def _open_many(base: str, path: str, secret: str, n: int) -> list[Stream]:
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda _: Stream(base, "GET", path, secret), range(n)))


def test_one_tenants_streams_are_capped_hold_no_connection_and_are_released(
    capped_server, api_tenant_a, api_tenant_b, streams
):
    run_a, run_b = _queued_run(api_tenant_a.tenant), _queued_run(api_tenant_b.tenant)
    # A first request warms the web process up (its cache and Redis clients), so the baseline is
    # what an idle, warmed-up process holds.
    warm = Stream(capped_server, "GET", f"/api/v1/runs/{run_b.pk}", api_tenant_b.key_secret)
    warm.close()
    time.sleep(0.5)
    db_before, redis_before = _web_db_connections(), _redis_clients()

    opened = _open_many(capped_server, f"/api/v1/runs/{run_a.pk}/events", api_tenant_a.key_secret, ATTEMPTS)
    streams.extend(opened)
    statuses = sorted(s.status for s in opened)
    assert statuses == [200] * CAP + [429] * (ATTEMPTS - CAP), statuses
    refused = next(s for s in opened if s.status == 429)
    assert refused.error["error"]["code"] == "throttled"
    assert f"{CAP} concurrent event streams" in refused.error["error"]["message"]
    assert int(refused.response.getheader("Retry-After")) >= 1

    # Tenant B is unaffected: its stream opens and its REST call answers within the bound.
    canary = Stream(capped_server, "GET", f"/api/v1/runs/{run_b.pk}/events", api_tenant_b.key_secret)
    streams.append(canary)
    assert canary.status == 200 and canary.seconds < CANARY_S
    rest = Stream(capped_server, "GET", f"/api/v1/runs/{run_b.pk}", api_tenant_b.key_secret)
    streams.append(rest)
    assert rest.status == 200 and rest.seconds < CANARY_S

    # Waiting streams hold no database connection (none pins one for its whole life).
    time.sleep(1.0)
    assert _web_db_connections() <= db_before + DB_POOL, "open event streams hold database connections"

    for stream in streams:
        stream.close()
    _wait_released(db_before, redis_before)
    # The disconnected streams gave their slots back: A may stream again, and the service is healthy.
    again = Stream(capped_server, "GET", f"/api/v1/runs/{run_a.pk}/events", api_tenant_a.key_secret)
    streams.append(again)
    assert again.status == 200
    health = Stream(capped_server, "GET", "/api/v1/health", api_tenant_b.key_secret)
    streams.append(health)
    assert health.status == 200


def test_openai_streams_count_against_the_same_cap_with_openais_envelope(capped_server, api_tenant_a, streams):
    run_a = _queued_run(api_tenant_a.tenant)
    streams.extend(_open_many(capped_server, f"/api/v1/runs/{run_a.pk}/events", api_tenant_a.key_secret, CAP))
    assert [s.status for s in streams] == [200] * CAP
    runs_before = Run.objects.filter(tenant=api_tenant_a.tenant).count()
    refused = _openai_stream(capped_server, api_tenant_a.key_secret)
    streams.append(refused)
    assert refused.status == 429
    assert refused.error["error"]["type"] == "rate_limit_error"
    assert refused.error["error"]["code"] == "rate_limit_exceeded"
    assert int(refused.response.getheader("Retry-After")) >= 1
    assert Run.objects.filter(tenant=api_tenant_a.tenant).count() == runs_before, "a refused request started a run"


def _models_answered(base: str, secret: str) -> bool:
    """Whether ``GET /v1/models`` (its key is checked in the database) answers 200 before the
    pool's wait would give up."""
    parts = urlsplit(base)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=POOL_TIMEOUT_S + 5)
    try:
        started = time.monotonic()
        conn.request("GET", "/v1/models", headers={"Authorization": f"Bearer {secret}"})
        status = conn.getresponse().status
        return status == 200 and time.monotonic() - started < POOL_TIMEOUT_S
    finally:
        conn.close()


def _openai_stream(base: str, secret: str) -> Stream:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}
    return Stream(base, "POST", "/v1/chat/completions", secret, body)


def test_an_openai_stream_holds_no_database_connection_and_releases_on_disconnect(capped_server, api_tenant_a, streams):
    """A /v1 stream waits on its run (queued here: no executor) without pinning a connection;
    the client leaving cancels the run and frees everything. A first stream, opened and left,
    warms the web process up (its Redis pools), so the baseline is what an idle process holds."""
    for attempt in ("warm-up", "measured"):
        if attempt == "measured":
            db_before, redis_before = _web_db_connections(), _redis_clients()
        stream = _openai_stream(capped_server, api_tenant_a.key_secret)
        streams.append(stream)
        assert stream.status == 200
        run_id = stream.response.getheader("X-Symphony-Run-Id")
        time.sleep(1.0)
        if attempt == "measured":
            assert _web_db_connections() <= db_before + DB_POOL, "an open /v1 stream holds a database connection"
            assert _models_answered(capped_server, api_tenant_a.key_secret), "the pool's connection is held"
        stream.close()
        wait_for(lambda r=run_id: Run.objects.get(pk=r).status == "cancelled", 15, message="the run cancelled")
    _wait_released(db_before, redis_before)


def test_leases_live_while_their_stream_does_and_expire_with_their_process(api_tenant_a, monkeypatch):
    """An open stream keeps its slot however long it lasts (also while its client reads nothing:
    the lease is refreshed on its own); a web process killed mid-stream never releases its
    leases, and they expire after the TTL, so the tenant's slots come back by themselves."""
    import asyncio

    from api.services import stream_leases

    monkeypatch.setattr(stream_leases, "LEASE_TTL_S", 1)
    monkeypatch.setattr(stream_leases, "REFRESH_EVERY_S", 0.2)
    account = api_tenant_a.tenant.account_key
    with redis.Redis.from_url(settings.REDIS_URL) as client:
        client.delete(f"symphony:streams:{account}")

    async def scenario() -> None:
        streaming = await stream_leases.acquire(account, 1)
        streaming.keep_alive()
        await asyncio.sleep(2.0)  # twice the TTL
        with pytest.raises(stream_leases.StreamLimitReached):
            await stream_leases.acquire(account, 1)
        await streaming.release()

        held = await stream_leases.acquire(account, 1)
        with pytest.raises(stream_leases.StreamLimitReached):
            await stream_leases.acquire(account, 1)
        assert held.refresher is None  # the process is gone: no release, no refresh
        await asyncio.sleep(1.5)
        again = await stream_leases.acquire(account, 1)
        await again.release()

    asyncio.run(scenario())


def test_a_stream_ends_when_cancelled_even_if_redis_swallows_the_cancellation(monkeypatch):
    """redis-py's asyncio client can swallow a cancellation that lands during a blocking XREAD
    (it disconnects and returns). Django cancels a request's task when its client leaves; the
    stream must still end and close its Redis connection rather than poll for nobody (a CI run
    once found one such stream left polling after its client had gone)."""
    import asyncio

    import redis.asyncio as aioredis

    from api.views.run_events import stream_entries

    real_xread = aioredis.Redis.xread
    swallowed: list[bool] = []

    async def swallowing_xread(self, *args, **kwargs):
        try:
            return await real_xread(self, *args, **kwargs)
        except asyncio.CancelledError:
            if swallowed:  # only the first: a failing test must still be able to stop the task
                raise
            swallowed.append(True)
            return []

    monkeypatch.setattr(aioredis.Redis, "xread", swallowing_xread)

    async def scenario() -> None:
        async def consume() -> None:
            async for _entry in stream_entries("no-such-run-cancelled"):
                pass

        task = asyncio.create_task(consume())
        await asyncio.sleep(0.3)  # inside a blocking XREAD
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=5)
        if not done:
            task.cancel()
            pytest.fail("the stream went on polling Redis after its task was cancelled")
        assert task.cancelled()

    asyncio.run(scenario())
    assert swallowed, "the cancellation never reached XREAD: the test proved nothing"


def test_the_tenants_of_one_account_share_one_cap(capped_server, api_tenant_a, api_tenant_b, streams):
    """A person's second tenant is no second cap: streams of every tenant one user created count
    together; another person's tenant still opens its own."""
    from tests.plugins.api import second_tenant_of

    second_tenant = second_tenant_of(api_tenant_a, "alpha-twin")
    twin, twin_secret = second_tenant.tenant, second_tenant.key_secret
    with redis.Redis.from_url(settings.REDIS_URL) as client:
        client.delete(f"symphony:streams:{twin.account_key}")  # a reused user id's old leases
    run_a, run_twin, run_b = _queued_run(api_tenant_a.tenant), _queued_run(twin), _queued_run(api_tenant_b.tenant)

    opened = _open_many(capped_server, f"/api/v1/runs/{run_a.pk}/events", api_tenant_a.key_secret, CAP)
    streams.extend(opened)
    assert sorted(s.status for s in opened) == [200] * CAP
    second = Stream(capped_server, "GET", f"/api/v1/runs/{run_twin.pk}/events", twin_secret)
    streams.append(second)
    assert second.status == 429, second.status
    assert f"{CAP} concurrent event streams across its tenants" in second.error["error"]["message"]
    other = Stream(capped_server, "GET", f"/api/v1/runs/{run_b.pk}/events", api_tenant_b.key_secret)
    streams.append(other)
    assert other.status == 200
