"""Per-address guards key on the real client, not on a forged ``X-Forwarded-For``, through a real
uvicorn: a new forged value per request neither escapes the sign-in, sign-up and reset-link
throttle nor the wrong-API-key guard, and a forged victim's address does not lock the victim
out. Behind a configured proxy (``SYMPHONY_TRUSTED_PROXIES``) the right-most address the proxy
did not vouch for is the client.

Clients on 127.0.0.2 are other machines: Linux routes all of 127/8 to the loopback."""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Iterator

import httpx
import pytest
from django.core.cache import cache

from tests.plugins.browser import child_env_for_test_db, start_uvicorn, stop

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration, pytest.mark.timeout(120)]

ATTACKER, VICTIM = "127.0.0.1", "127.0.0.2"
#: SYMPHONY_AUTH_THROTTLE / SYMPHONY_BAD_KEY_THROTTLE defaults (web/settings.py).
AUTH_LIMIT, BAD_KEY_LIMIT = 20, 30
_forged = (f"10.{i // 250 % 250}.{i % 250}.{i % 7 + 1}" for i in itertools.count(1))


@contextlib.contextmanager
def _client(url: str, source: str) -> Iterator[httpx.Client]:
    """A client connecting from ``source`` with the CSRF cookie and header the console sends
    (sign-in and sign-up refuse requests without them)."""
    with httpx.Client(base_url=url, transport=httpx.HTTPTransport(local_address=source), timeout=10) as client:
        client.headers["X-CSRFToken"] = client.get("/api/v1/auth/csrf").json()["csrftoken"]
        yield client


@pytest.fixture(autouse=True)
def _fresh_counters() -> Iterator[None]:
    cache.clear()  # the throttles' shared Redis cache, also the server's
    yield
    cache.clear()


def test_rotating_forwarded_for_does_not_escape_the_auth_throttle(api_asgi_server, api_tenant_a, api_tenant_b):
    """Sign-in, sign-up and reset links share the ``auth`` throttle per client; none of these
    attempts changes anything (wrong password, refused sign-up, bad reset link)."""
    attempts = itertools.cycle(
        [
            ("/api/v1/auth/login", {"email": api_tenant_a.user.email, "password": "not-the-password"}),
            ("/api/v1/auth/signup", {"email": "new@example.com", "password": "x", "tenant_name": "t"}),
            ("/api/v1/auth/password-reset/confirm", {"uid": "MQ", "token": "guess", "new_password": "x" * 12}),
        ]
    )
    with _client(api_asgi_server, ATTACKER) as attacker:
        answers = [
            attacker.post(path, json=body, headers={"X-Forwarded-For": next(_forged)})
            for path, body in itertools.islice(attempts, AUTH_LIMIT + 6)
        ]
    codes = [r.status_code for r in answers]
    assert 429 not in codes[:AUTH_LIMIT] and {401, 400} <= set(codes[:AUTH_LIMIT]), codes
    assert codes[AUTH_LIMIT:] == [429] * 6, codes
    refused = answers[-1]
    assert refused.json()["error"]["code"] == "throttled" and int(refused.headers["Retry-After"]) > 0

    started = time.monotonic()
    with _client(api_asgi_server, VICTIM) as other:
        login = other.post("/api/v1/auth/login", json={"email": api_tenant_b.user.email, "password": "pw-12345678"})
    assert login.status_code == 200, login.text
    assert time.monotonic() - started < 5


def test_forged_forwarded_for_neither_escapes_nor_pins_the_wrong_key_guard(api_asgi_server, api_tenant_a, api_tenant_b):
    bad = {"Authorization": "Bearer sk_nope_" + "x" * 43}
    with _client(api_asgi_server, ATTACKER) as attacker:
        pinned = [
            attacker.get("/api/v1/programs", headers={**bad, "X-Forwarded-For": VICTIM}) for _ in range(BAD_KEY_LIMIT)
        ]
        rotating = [
            attacker.get("/api/v1/programs", headers={**bad, "X-Forwarded-For": next(_forged)}) for _ in range(10)
        ]
        own_key = attacker.get("/api/v1/programs", headers={"Authorization": f"Bearer {api_tenant_a.key_secret}"})
    codes = [r.status_code for r in pinned + rotating]
    assert codes[:BAD_KEY_LIMIT] == [401] * BAD_KEY_LIMIT, codes
    assert set(codes[BAD_KEY_LIMIT:]) == {429}, codes
    assert rotating[-1].json()["error"]["code"] == "throttled"
    assert own_key.status_code == 429  # every key from the guessing address, until the window ends

    started = time.monotonic()
    with _client(api_asgi_server, VICTIM) as victim:
        canary = victim.get("/api/v1/programs", headers={"Authorization": f"Bearer {api_tenant_b.key_secret}"})
    assert canary.status_code == 200, canary.text
    assert time.monotonic() - started < 5


@pytest.fixture
def behind_proxy(transactional_db) -> Iterator[str]:
    """uvicorn whose only trusted proxy is 127.0.0.1 (the tests' client plays the load balancer)."""
    proc, url = start_uvicorn({**child_env_for_test_db(), "SYMPHONY_TRUSTED_PROXIES": "127.0.0.1/32"})
    yield url
    stop(proc, timeout=10)


def test_behind_a_trusted_proxy_the_right_most_untrusted_address_is_the_client(
    behind_proxy, api_tenant_a, api_tenant_b
):
    guesser = "198.51.100.7"
    bad = {"Authorization": "Bearer sk_nope_" + "x" * 43}
    with _client(behind_proxy, ATTACKER) as proxy:
        # What the client wrote, then what the proxy appended: only the latter counts.
        codes = [
            proxy.get("/api/v1/programs", headers={**bad, "X-Forwarded-For": f"{next(_forged)}, {guesser}"}).status_code
            for _ in range(BAD_KEY_LIMIT + 2)
        ]
        assert codes == [401] * BAD_KEY_LIMIT + [429] * 2, codes
        started = time.monotonic()
        other_client = {"Authorization": f"Bearer {api_tenant_b.key_secret}", "X-Forwarded-For": "203.0.113.9"}
        canary = proxy.get("/api/v1/programs", headers=other_client)
        assert canary.status_code == 200, canary.text
        assert time.monotonic() - started < 5
        locked = proxy.get(
            "/api/v1/programs",
            headers={"Authorization": f"Bearer {api_tenant_a.key_secret}", "X-Forwarded-For": guesser},
        )
        assert locked.status_code == 429
    with _client(behind_proxy, VICTIM) as untrusted_peer:
        # A peer that is not a trusted proxy is the client, whatever it forwards.
        forged = untrusted_peer.get(
            "/api/v1/programs",
            headers={"Authorization": f"Bearer {api_tenant_a.key_secret}", "X-Forwarded-For": guesser},
        )
    assert forged.status_code == 200, forged.text
