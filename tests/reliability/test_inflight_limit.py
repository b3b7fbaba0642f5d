"""Requests in flight are bounded per client and per web process, and a trickled request body
is cut off (web/inflight_limit.py), through a real uvicorn: a client holding its share of slots
with bodies it never sends gets a clear 429, another client's request still succeeds at once,
the health check is never refused, and the held slots come back when their bodies time out.

Clients on 127.0.0.x are other machines: Linux routes all of 127/8 to the loopback."""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest

from tests.plugins.browser import child_env_for_test_db, start_uvicorn, stop

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration, pytest.mark.timeout(120)]

PER_CLIENT, TOTAL, BODY_IDLE_S = 3, 6, 3
#: Two addresses no other test uses: the wrong-key guard remembers addresses in the shared cache
#: for a while (api/authentication.py), and a test that sent bad keys from 127.0.0.2 would get this
#: one's canary refused as a guesser.
CLIENT, OTHER = (f"127.{random.randrange(1, 255)}.{random.randrange(1, 255)}.{n}" for n in (11, 12))


@pytest.fixture
def bounded_server(transactional_db) -> Iterator[str]:
    env = {
        **child_env_for_test_db(),
        "SYMPHONY_MAX_INFLIGHT_PER_CLIENT": str(PER_CLIENT),
        "SYMPHONY_MAX_INFLIGHT_TOTAL": str(TOTAL),
        "SYMPHONY_BODY_IDLE_TIMEOUT_S": str(BODY_IDLE_S),
    }
    proc, url = start_uvicorn(env)
    yield url
    stop(proc, timeout=10)


def _hold_slot(url: str, source: str, path: str = "/api/v1/programs") -> socket.socket:
    """A request whose body is announced and never sent: it stays in flight until timed out."""
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=BODY_IDLE_S + 10, source_address=(source, 0))
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    )
    sock.sendall(head.encode())
    return sock


def _read_to_close(sock: socket.socket) -> str:
    """All the server sent until it closed the connection (a 408 closes it)."""
    chunks = []
    while chunk := sock.recv(4096):
        chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


def _get(url: str, source: str, path: str, **headers: str) -> httpx.Response:
    transport = httpx.HTTPTransport(local_address=source)
    with httpx.Client(base_url=url, transport=transport, timeout=10) as client:
        return client.get(path, headers=headers)


def _wait_until(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_a_client_at_its_bound_leaves_another_clients_requests_unharmed(bounded_server, api_tenant_a, api_tenant_b):
    held = [_hold_slot(bounded_server, CLIENT) for _ in range(PER_CLIENT)]
    try:
        own = f"Bearer {api_tenant_a.key_secret}"
        refused = None
        if _wait_until(
            lambda: _get(bounded_server, CLIENT, "/api/v1/programs", Authorization=own).status_code == 429, 5
        ):
            refused = _get(bounded_server, CLIENT, "/api/v1/programs", Authorization=own)
        assert refused is not None and refused.status_code == 429, "the client's 4th request in flight was not refused"
        assert refused.json()["error"]["code"] == "too_many_requests_in_flight"
        assert "SYMPHONY_MAX_INFLIGHT_PER_CLIENT" in refused.json()["error"]["message"]
        assert refused.headers["Retry-After"] == "1"
        openai_shaped = _get(bounded_server, CLIENT, "/v1/models", Authorization=own)
        assert openai_shaped.status_code == 429 and openai_shaped.json()["error"]["type"] == "rate_limit_error"
        assert _get(bounded_server, CLIENT, "/api/v1/health").status_code in (200, 503)  # never refused here

        started = time.monotonic()
        canary = _get(bounded_server, OTHER, "/api/v1/programs", Authorization=f"Bearer {api_tenant_b.key_secret}")
        assert canary.status_code == 200, canary.text
        assert time.monotonic() - started < 5

        # The trickled bodies time out with a clear 408, and the client's slots come back.
        answers = [_read_to_close(sock) for sock in held]
        assert all(a.startswith("HTTP/1.1 408") and "body_timeout" in a for a in answers), answers
        again = _get(bounded_server, CLIENT, "/api/v1/programs", Authorization=own)
        assert again.status_code == 200, again.text
    finally:
        for sock in held:
            sock.close()


def test_the_process_bound_answers_503_overloaded(bounded_server, api_tenant_b):
    held = [_hold_slot(bounded_server, f"127.0.0.{10 + i % 3}") for i in range(TOTAL)]
    try:
        key = f"Bearer {api_tenant_b.key_secret}"
        assert _wait_until(
            lambda: _get(bounded_server, OTHER, "/api/v1/programs", Authorization=key).status_code == 503, 5
        )
        overloaded = _get(bounded_server, OTHER, "/api/v1/programs", Authorization=key)
        assert overloaded.json()["error"]["code"] == "overloaded" and overloaded.headers["Retry-After"] == "1"
    finally:
        for sock in held:
            sock.close()
    assert _wait_until(lambda: _get(bounded_server, OTHER, "/api/v1/programs", Authorization=key).status_code == 200, 5)
