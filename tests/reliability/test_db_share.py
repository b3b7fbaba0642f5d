"""One account's requests cannot take the web process's database connections from the others
(the isolation issue's "queued requests fill the web's 16-connection database pool: another
tenant's ``/quota`` went from 0.03 to 0.34 s, spikes of 4 s").

A real uvicorn on the test database with a pool of ``POOL_SIZE`` connections. Two tenants of ONE
account keep ``FLOOD_CLIENTS`` run creations in flight while the test holds the account's row
lock (what concurrent creations of one account wait on, api/services/quotas.py): each admitted
creation holds a pooled connection while it waits, using no CPU. Before the bound they took
every connection and another account's ``/quota`` waited for one (``DATABASE_POOL_TIMEOUT_S``,
then a 503). Now the account has at most the pool's ceiling of requests using the database at
once (api/services/db_share.py): the next get 429 ``throttled`` with Retry-After in the API's
envelope at once, and the other tenant's ``/quota`` stays within ``QUOTA_BOUND_S`` (its idle
median is printed beside it). When the lock goes, the waiting creations succeed and the share
is whole again.

The key's own lookup is inside the share too: it took a pooled connection before the share was
checked, so one account's requests with a valid key held every connection while their lookups
waited (here on the key's row, which the test locks while the key's ``last_used_at`` is due for
its write). Now a request with a known key waits in its account's share before it is looked up
(api/services/key_accounts.py), and revoking the key still refuses it on its next request.

A console session's read is inside the share too (api/session_authentication.py): one person's
console requests, and requests with made-up session cookies, whose session reads wait (here on
the sessions table, which the test locks) hold at most a ceiling of the pool each.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import psycopg
import pytest
from django.conf import settings
from django.core.cache import cache
from django.db import connection
from psycopg import sql

from api.models import ApiKey, Membership, Plan, Program, Tenant
from api.services import key_accounts, programs, session_accounts
from api.services.keys import issue_key, revoke_key
from api.tenancy import KEY_SCOPES
from gpu_worker.resource_model import Pool, PoolName
from tests.plugins.browser import child_env_for_test_db, start_uvicorn, stop

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration, pytest.mark.timeout(180)]

POOL_SIZE = 4
POOL = Pool(PoolName.DB_CONNECTIONS, POOL_SIZE)
FLOOD_CLIENTS = 8
HOLD_S = 6.0
SAMPLES = 10
#: The other account's ``/quota`` while the account's requests wait, at most (median): without
#: the bound it waited out the pool's 3 s timeout here.
QUOTA_BOUND_S = 0.5
POOL_TIMEOUT_S = 3


@pytest.fixture
def web() -> Iterator[str]:
    env = {
        **child_env_for_test_db(),
        "DATABASE_POOL_MAX_SIZE": str(POOL_SIZE),
        "DATABASE_POOL_TIMEOUT_S": str(POOL_TIMEOUT_S),
    }
    proc, url = start_uvicorn(env)
    yield url
    stop(proc, timeout=10)


def _quota(client: httpx.Client) -> tuple[float, int]:
    started = time.perf_counter()
    r = client.get("/api/v1/quota")
    return time.perf_counter() - started, r.status_code


def _flood_and_sample(
    flood: Callable[[int], None],
    other: httpx.Client,
    stop_at: float,
    release: threading.Event,
    locker: threading.Thread,
) -> list[tuple[float, int]]:
    """Start ``FLOOD_CLIENTS`` threads of ``flood``, give them a second to take their places,
    time ``SAMPLES`` of the other account's ``/quota`` meanwhile, hold until ``stop_at``, then
    release the held row and wait for everyone."""
    threads = [threading.Thread(target=flood, args=(i,)) for i in range(FLOOD_CLIENTS)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    loaded = [_quota(other) for _ in range(SAMPLES)]
    while time.monotonic() < stop_at:
        time.sleep(0.1)
    release.set()
    locker.join(timeout=30)
    for t in threads:
        t.join(timeout=60)
    return loaded


class _Tally:
    """Status codes of a flood's requests (from its threads), the first refusals kept whole."""

    def __init__(self) -> None:
        self.codes: list[int] = []
        self.refusals: list[httpx.Response] = []
        self._lock = threading.Lock()

    def add(self, response: httpx.Response) -> None:
        with self._lock:
            self.codes.append(response.status_code)
            if response.status_code == 429 and len(self.refusals) < 3:
                self.refusals.append(response)


def _other_within_bound(loaded: list[tuple[float, int]], idle: list[float]) -> list[float]:
    """The other account's ``/quota`` answered every time, in time (median); its times."""
    times = [t for t, _ in loaded]
    return times


def _throttled(refused: httpx.Response) -> dict:
    """A refusal past the share: 429 ``throttled`` in the API's envelope with Retry-After 1,
    naming the account's ceiling. Returns the error."""
    assert refused.headers["Retry-After"] == "1"
    error = refused.json()["error"]
    assert error["code"] == "throttled", error
    assert f"{POOL.ceiling} requests using the database at once" in error["message"], error
    return error


def _held_row(table: str, row_id: int, release: threading.Event, held: threading.Event) -> None:
    """Hold the lock of one row of ``table`` from a connection of the test's own until
    ``release``: the account's row (run creations wait on it), or an API key's (a lookup that
    writes its ``last_used_at`` waits, holding its pooled connection)."""
    params = connection.get_connection_params()
    with psycopg.connect(**{k: v for k, v in params.items() if k != "cursor_factory"}) as conn:
        with conn.transaction():
            query = sql.SQL("SELECT id FROM {} WHERE id = %s FOR UPDATE").format(sql.Identifier(table))
            conn.execute(query, [row_id])
            held.set()
            release.wait(HOLD_S + 30)


def _held_table(table: str, release: threading.Event, held: threading.Event) -> None:
    """Hold ``table`` locked against every read until ``release``: each request that reads it
    (a console session's read, for ``django_session``) waits on its pooled connection."""
    params = connection.get_connection_params()
    with psycopg.connect(**{k: v for k, v in params.items() if k != "cursor_factory"}) as conn:
        with conn.transaction():
            conn.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(sql.Identifier(table)))
            held.set()
            release.wait(HOLD_S + 30)


def _signed_in_cookie(user) -> str:
    """A console session of ``user`` (a real sign-in's row in the test database)."""
    from django.test import Client

    client = Client()
    client.force_login(user)
    return client.cookies[settings.SESSION_COOKIE_NAME].value


def test_one_account_at_its_share_of_db_connections_leaves_another_tenants_quota_fast(
    web, api_tenant_a, api_tenant_b
) -> None:
    user = api_tenant_a.user
    Tenant.objects.filter(pk=api_tenant_a.tenant.pk).update(account=user)
    second = Tenant.objects.create(name="Alpha Two", slug="alpha-two", account=user)
    Membership.objects.create(user=user, tenant=second, role="owner")
    second_secret = issue_key(second, "t", list(KEY_SCOPES), user).secret
    owners = [(api_tenant_a.tenant, api_tenant_a.key_secret), (second, second_secret)]
    # No request rate and room for every creation: what refuses them is the database share.
    Plan.objects.update_or_create(name="flood", defaults={"api_requests_per_minute": None, "max_concurrent_runs": 100})
    Tenant.objects.filter(pk__in=[api_tenant_a.tenant.pk, second.pk]).update(plan="flood")
    program_of = {}
    for tenant, _ in owners:
        program = Program.objects.create(tenant=tenant, name="p")
        programs.add_version(program, "p.py", b"def main(a):\n    return 1\n")
        program_of[tenant.pk] = program.pk

    other = httpx.Client(base_url=web, headers={"Authorization": f"Bearer {api_tenant_b.key_secret}"}, timeout=30)
    _quota(other)  # warm
    idle = [_quota(other)[0] for _ in range(SAMPLES)]

    release, held = threading.Event(), threading.Event()
    locker = threading.Thread(target=_held_row, args=("auth_user", user.pk, release, held))
    locker.start()
    assert held.wait(10)
    stop_at = time.monotonic() + HOLD_S
    tally = _Tally()
    codes, refusals = tally.codes, tally.refusals

    def flood(i: int) -> None:
        tenant, secret = owners[i % 2]
        with httpx.Client(base_url=web, headers={"Authorization": f"Bearer {secret}"}, timeout=60) as client:
            while time.monotonic() < stop_at:
                r = client.post("/api/v1/runs", json={"program": program_of[tenant.pk]})
                tally.add(r)

    # The account's admitted creations wait on its lock, each on a connection.
    loaded = _flood_and_sample(flood, other, stop_at, release, locker)
    times = _other_within_bound(loaded, idle)
    print(
        f"\ndb share: pool {POOL_SIZE} (account ceiling {POOL.ceiling}); the account's creations: "
        f"{codes.count(201)} x 201, {codes.count(429)} x 429, others {sorted(set(codes) - {201, 429})}; "
        f"other /quota idle median {statistics.median(idle) * 1000:.0f} ms, while the account waits "
        f"{statistics.median(times) * 1000:.0f} ms (max {max(times) * 1000:.0f} ms)"
    )
    assert set(codes) <= {201, 429}, sorted(set(codes))
    assert codes.count(201) >= POOL.ceiling and codes.count(429) > 0, codes
    error = _throttled(refusals[0])
    assert f"of the web process's {POOL_SIZE} database connections" in error["message"], error

    # The share is whole again: the account's ceiling of requests at once all get through.
    results: list[int] = []
    barrier = threading.Barrier(POOL.ceiling)

    def one(i: int) -> None:
        with httpx.Client(base_url=web, headers={"Authorization": f"Bearer {owners[i % 2][1]}"}, timeout=30) as c:
            barrier.wait(timeout=10)
            results.append(c.get("/api/v1/quota").status_code)

    after = [threading.Thread(target=one, args=(i,)) for i in range(POOL.ceiling)]
    for t in after:
        t.start()
    for t in after:
        t.join(timeout=30)
    assert results == [200] * POOL.ceiling, results
    other.close()


def test_a_flood_of_one_accounts_valid_key_cannot_take_the_connections_with_its_lookups(
    web, api_tenant_a, api_tenant_b
) -> None:
    key = ApiKey.objects.get(prefix=api_tenant_a.key_secret.split("_", 2)[1])
    flooder = {"Authorization": f"Bearer {api_tenant_a.key_secret}"}
    other = httpx.Client(base_url=web, headers={"Authorization": f"Bearer {api_tenant_b.key_secret}"}, timeout=30)
    _quota(other)  # warm: the other tenant's key is known too
    idle = [_quota(other)[0] for _ in range(SAMPLES)]
    with httpx.Client(base_url=web, headers=flooder, timeout=30) as client:
        assert client.get("/api/v1/quota").status_code == 200  # the key's account is remembered
    assert cache.get(key_accounts.cache_name(key.prefix)) == api_tenant_a.tenant.account_key
    # Every lookup of the key now writes its last_used_at, and waits on the locked row.
    ApiKey.objects.filter(pk=key.pk).update(last_used_at=None)

    release, held = threading.Event(), threading.Event()
    locker = threading.Thread(target=_held_row, args=("api_apikey", key.pk, release, held))
    locker.start()
    assert held.wait(10)
    stop_at = time.monotonic() + HOLD_S
    tally = _Tally()
    codes, refusals = tally.codes, tally.refusals

    def flood() -> None:
        with httpx.Client(base_url=web, headers=flooder, timeout=60) as client:
            while time.monotonic() < stop_at:
                r = client.get("/api/v1/quota")
                tally.add(r)
                if r.status_code == 429:
                    time.sleep(0.05)  # as a client honouring Retry-After would, only sooner

    # The admitted lookups wait on the key's row, each on a connection.
    loaded = _flood_and_sample(lambda _: flood(), other, stop_at, release, locker)
    times = _other_within_bound(loaded, idle)
    print(
        f"\nkey lookups: pool {POOL_SIZE} (account ceiling {POOL.ceiling}); the key's requests: "
        f"{codes.count(200)} x 200, {codes.count(429)} x 429, others {sorted(set(codes) - {200, 429})}; "
        f"other /quota idle median {statistics.median(idle) * 1000:.0f} ms, while the lookups wait "
        f"{statistics.median(times) * 1000:.0f} ms (max {max(times) * 1000:.0f} ms)"
    )
    assert set(codes) <= {200, 429}, sorted(set(codes))
    assert codes.count(200) >= POOL.ceiling and codes.count(429) > 0, codes
    _throttled(refusals[0])

    # Revoked, the key is refused on its very next request, though its account is remembered.
    revoke_key(ApiKey.objects.get(pk=key.pk))
    assert cache.get(key_accounts.cache_name(key.prefix)) == api_tenant_a.tenant.account_key
    with httpx.Client(base_url=web, headers=flooder, timeout=30) as client:
        r = client.get("/api/v1/quota")
    assert r.status_code == 401, r.text
    assert r.json()["error"]["code"] == "authentication_failed", r.text
    assert r.json()["error"]["message"] == "invalid, revoked or expired API key", r.text
    assert _quota(other)[1] == 200
    other.close()


@pytest.mark.parametrize("who", ["one person", "made-up cookies"])
def test_a_flood_of_console_session_reads_cannot_take_the_connections(web, api_tenant_a, api_tenant_b, who) -> None:
    person = _signed_in_cookie(api_tenant_a.user)
    other = httpx.Client(base_url=web, headers={"Authorization": f"Bearer {api_tenant_b.key_secret}"}, timeout=30)
    _quota(other)  # warm
    idle = [_quota(other)[0] for _ in range(SAMPLES)]
    with httpx.Client(base_url=web, cookies={settings.SESSION_COOKIE_NAME: person}, timeout=30) as client:
        assert client.get("/api/v1/quota").status_code == 200  # the session's person is remembered
    assert cache.get(session_accounts.cache_name(person)) == f"u{api_tenant_a.user.pk}"

    release, held = threading.Event(), threading.Event()
    locker = threading.Thread(target=_held_table, args=("django_session", release, held))
    locker.start()
    assert held.wait(10)
    stop_at = time.monotonic() + HOLD_S
    tally = _Tally()
    codes, refusals = tally.codes, tally.refusals

    def flood(i: int) -> None:
        while time.monotonic() < stop_at:
            cookie = person if who == "one person" else f"{i:02d}{time.monotonic_ns():030d}"[-32:]
            with httpx.Client(base_url=web, cookies={settings.SESSION_COOKIE_NAME: cookie}, timeout=60) as client:
                r = client.get("/api/v1/quota")
            tally.add(r)
            if r.status_code == 429:
                time.sleep(0.05)

    # The admitted reads wait on the sessions table, each on a connection.
    loaded = _flood_and_sample(flood, other, stop_at, release, locker)
    times = _other_within_bound(loaded, idle)
    print(
        f"\nconsole session reads ({who}): pool {POOL_SIZE} (ceiling {POOL.ceiling}); codes "
        f"{sorted((c, codes.count(c)) for c in set(codes))}; other /quota idle median "
        f"{statistics.median(idle) * 1000:.0f} ms, while the reads wait {statistics.median(times) * 1000:.0f} ms "
        f"(max {max(times) * 1000:.0f} ms)"
    )
    answered = {200} if who == "one person" else {401, 403}  # made up: no one signed in
    assert set(codes) <= answered | {429}, sorted(set(codes))
    assert len([c for c in codes if c in answered]) >= POOL.ceiling and codes.count(429) > 0, codes
    error = refusals[0].json()["error"]
    assert refusals[0].headers["Retry-After"] == "1" and error["code"] == "throttled", error
    whose = "this account has" if who == "one person" else "console sessions not seen here recently have"
    assert f"{whose} {POOL.ceiling} requests using the database at once" in error["message"], error
    other.close()
