"""Replays of finished runs' streams that are never read do not hold the web process (the
isolation issue's "32 replay slots held ~1.08 GB of the web process, not returned after the
clients left; per-address caps let one address drive 4 tenants").

A real uvicorn on the test database and Redis, a finished run whose stream holds ~40 MB in
256 KiB entries, and raw sockets that ask for its events, read a few KB and then stop reading
while keeping the connection open:

* the web process's peak memory grows by little more than the replays' slots (pages bounded in
  bytes), and each stalled replay is stopped ``SYMPHONY_REPLAY_STALL_S`` later: its stream lease
  is freed while its client still holds the socket;
* the replay memory (``SYMPHONY_REPLAY_MEMORY_BYTES``) is shared per ACCOUNT: two tenants of one
  person together get the pool's ceiling, the next replay a 429 ``throttled`` with Retry-After,
  while another account's replay is still served.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
import redis
from django.conf import settings

from api.models import Program, Run, Tenant
from api.services import programs, replay_memory
from api.services.keys import issue_key
from api.tenancy import KEY_SCOPES
from gpu_worker.resource_model import Pool, PoolName
from tests.conftest import wait_for
from tests.plugins.browser import child_env_for_test_db, start_uvicorn, stop

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration, pytest.mark.timeout(180)]

MIB = 1024 * 1024
ENTRIES = 160
ENTRY_BYTES = 256 * 1024
STALL_S = 3.0
POOL_BYTES = 8 * replay_memory.SLOT_BYTES
POOL = Pool(PoolName.REPLAY_MEMORY_BYTES, POOL_BYTES, min_reserve=replay_memory.SLOT_BYTES)
#: Replays one account may hold alone.
PER_ACCOUNT = POOL.ceiling // replay_memory.SLOT_BYTES


@pytest.fixture
def web() -> Iterator[tuple[str, int]]:
    env = {
        **child_env_for_test_db(),
        "SYMPHONY_REPLAY_STALL_S": str(STALL_S),
        "SYMPHONY_REPLAY_MEMORY_BYTES": str(POOL_BYTES),
    }
    proc, url = start_uvicorn(env)
    yield url, proc.pid
    stop(proc, timeout=10)


def _status(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith(f"{field}:"))
    return int(line.split()[1]) * 1024


def _finished_run(tenant: Tenant) -> Run:
    program = Program.objects.create(tenant=tenant, name=f"big-{tenant.pk}")
    version = programs.add_version(program, "p.py", b"def main(a):\n    return 1\n")
    run = Run.objects.create(tenant=tenant, program_version=version, args={}, limits={}, status="succeeded")
    client = redis.Redis.from_url(settings.REDIS_URL)
    chunk = '{"text": "' + "x" * (ENTRY_BYTES - 12) + '"}'
    pipe = client.pipeline(transaction=False)
    for _ in range(ENTRIES):
        pipe.xadd(f"run:{run.pk}", {"type": "token", "data": chunk})
    pipe.xadd(f"run:{run.pk}", {"type": "end", "data": '{"status": "succeeded"}'})
    pipe.execute()
    return run


def _open(url: str, secret: str, run: Run) -> tuple[socket.socket, bytes]:
    """Ask for the run's events, read the first few KB, and stop reading."""
    parts = urlsplit(url)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((parts.hostname, parts.port))
    head = f"GET /api/v1/runs/{run.pk}/events HTTP/1.1\r\nHost: {parts.netloc}\r\n"
    sock.sendall(f"{head}Authorization: Bearer {secret}\r\n\r\n".encode())
    sock.settimeout(10)
    return sock, sock.recv(4096)


def _whole_body(sock: socket.socket, head: bytes) -> bytes:
    """The body of a refused (non-streamed) reply: its first ``recv`` may have held only headers."""
    while b"\r\n\r\n" not in head:
        head += sock.recv(4096)
    headers, body = head.split(b"\r\n\r\n", 1)
    length = next(
        int(line.split(b":", 1)[1]) for line in headers.split(b"\r\n") if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = sock.recv(4096)
        assert chunk, f"the connection closed after {len(body)} of {length} body bytes"
        body += chunk
    return body


def _leases(tenant: Tenant) -> int:
    client = redis.Redis.from_url(settings.REDIS_URL)
    return int(client.zcard(f"symphony:streams:{tenant.account_key}"))


def test_a_replay_nobody_reads_is_stopped_and_its_memory_bounded(web, api_tenant_a):
    url, pid = web
    run = _finished_run(api_tenant_a.tenant)
    socks = []
    try:
        _open(url, api_tenant_a.key_secret, run)[0].close()  # warm the process up
        wait_for(lambda: _leases(api_tenant_a.tenant) == 0, 30, message="the warm-up replay to end")
        before = _status(pid, "VmHWM")
        for _ in range(4):
            sock, head = _open(url, api_tenant_a.key_secret, run)
            assert head.startswith(b"HTTP/1.1 200"), head[:200]
            socks.append(sock)
        time.sleep(1.0)
        assert _leases(api_tenant_a.tenant) == 4
        growth = _status(pid, "VmHWM") - before
        assert growth < 4 * replay_memory.SLOT_BYTES + 16 * MIB, f"4 stalled replays took {growth >> 20} MiB"
        started = time.monotonic()
        wait_for(lambda: _leases(api_tenant_a.tenant) == 0, STALL_S + 10, message="the stalled replays to stop")
        freed_s = time.monotonic() - started + 1.0
        print(f"replay stall: 4 stalled replays grew peak memory {growth >> 20} MiB, freed after {freed_s:.1f} s")
        assert freed_s < STALL_S + 5
    finally:
        for sock in socks:
            sock.close()
        redis.Redis.from_url(settings.REDIS_URL).delete(f"run:{run.pk}")


def test_replay_memory_is_shared_per_account_not_per_tenant(web, api_tenant_a, api_tenant_b):
    url, _ = web
    user = api_tenant_a.user
    Tenant.objects.filter(pk=api_tenant_a.tenant.pk).update(account=user)
    second = Tenant.objects.create(name="Alpha Two", slug="alpha-two", account=user)
    second_secret = issue_key(second, "test", list(KEY_SCOPES), user).secret
    runs = {tenant.pk: _finished_run(tenant) for tenant in (api_tenant_a.tenant, second, api_tenant_b.tenant)}
    socks = []
    try:
        for i in range(PER_ACCOUNT):
            tenant, secret = (api_tenant_a.tenant, api_tenant_a.key_secret) if i % 2 else (second, second_secret)
            sock, head = _open(url, secret, runs[tenant.pk])
            assert head.startswith(b"HTTP/1.1 200"), head[:300]
            socks.append(sock)
        sock, head = _open(url, second_secret, runs[second.pk])
        socks.append(sock)
        assert head.startswith(b"HTTP/1.1 429"), head[:300]
        assert b"retry-after: 5" in head.lower()
        body = json.loads(_whole_body(sock, head))
        assert body["error"]["code"] == "throttled" and body["error"]["detail"] == {"retry_after": 5}, body
        assert str(POOL.ceiling) in body["error"]["message"]
        sock, head = _open(url, api_tenant_b.key_secret, runs[api_tenant_b.tenant.pk])
        socks.append(sock)
        assert head.startswith(b"HTTP/1.1 200"), head[:300]
    finally:
        for sock in socks:
            sock.close()
        redis.Redis.from_url(settings.REDIS_URL).delete(*[f"run:{run.pk}" for run in runs.values()])
