"""Replaying a big finished stream is read from Redis in pages (the hardening issue's "replaying
the stream grew the web process by 500 MB because it reads the whole stream at once").

``entry_pages`` is checked on the real Redis; end to end, a finished run whose stream holds
~38 MB is replayed over HTTP from a real uvicorn whose peak memory (``VmHWM``) must grow by far
less than the stream, while another tenant's request is answered within a bound.
"""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.request
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio as aioredis
from django.conf import settings

from api.models import Program, Run
from api.services import programs
from tests.plugins.browser import child_env_for_test_db, start_uvicorn, stop

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration, pytest.mark.timeout(180)]

ENTRIES = 1200
ENTRY_BYTES = 32 * 1024
#: The replay may raise the web process's peak memory by at most this much (the stream is ~38 MB).
MAX_GROWTH_BYTES = 16 * 1024 * 1024
CANARY_S = 5.0


def _pages(key: str, after: str, until: str = "+", page: int = 100) -> list[list[str]]:
    from api.views.run_events import entry_pages

    async def read() -> list[list[str]]:
        client = aioredis.Redis.from_url(settings.REDIS_URL)
        try:
            return [
                [e.id for e in entries] async for entries in entry_pages(client, key, after, until, max_entries=page)
            ]
        finally:
            await client.aclose()

    return asyncio.run(read())


def test_entry_pages_reads_page_by_page_from_after_up_to_until():
    key = "run:test-entry-pages"
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.delete(key)
    try:
        ids = [client.xadd(key, {"type": "token", "data": str(i)}).decode() for i in range(250)]
        assert [len(p) for p in _pages(key, "0-0")] == [100, 100, 50]
        assert [i for p in _pages(key, "0-0") for i in p] == ids
        assert [i for p in _pages(key, ids[9], until=ids[149]) for i in p] == ids[10:150]
        assert [len(p) for p in _pages(key, ids[49], until=ids[149])] == [100]  # stops at until
        assert _pages(key, ids[-1]) == []
    finally:
        client.delete(key)


@pytest.fixture
def web() -> Iterator[tuple[str, int]]:
    proc, url = start_uvicorn(child_env_for_test_db())
    yield url, proc.pid
    stop(proc, timeout=10)


def _peak_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def _get(url: str, secret: str) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {secret}"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return response.status, response.read()


def test_a_big_finished_stream_is_replayed_in_pages(web, api_tenant_a, api_tenant_b):
    url, pid = web
    program = Program.objects.create(tenant=api_tenant_a.tenant, name="big")
    version = programs.add_version(program, "p.py", b"def main(a):\n    return 1\n")
    run = Run.objects.create(
        tenant=api_tenant_a.tenant, program_version=version, args={}, limits={}, status="succeeded"
    )
    key = f"run:{run.pk}"
    client = redis.Redis.from_url(settings.REDIS_URL)
    chunk = '{"text": "' + "x" * (ENTRY_BYTES - 12) + '"}'
    try:
        pipe = client.pipeline(transaction=False)
        for _ in range(ENTRIES):
            pipe.xadd(key, {"type": "token", "data": chunk})
        pipe.xadd(key, {"type": "end", "data": '{"status": "succeeded"}'})
        pipe.execute()
        _get(f"{url}/api/v1/runs/{run.pk}", api_tenant_a.key_secret)  # warm the process up
        before = _peak_rss(pid)

        canary: dict = {}

        def ask() -> None:
            time.sleep(0.2)
            started = time.monotonic()
            canary["status"], _ = _get(f"{url}/api/v1/runs", api_tenant_b.key_secret)
            canary["seconds"] = time.monotonic() - started

        thread = threading.Thread(target=ask)
        thread.start()
        status, body = _get(f"{url}/api/v1/runs/{run.pk}/events", api_tenant_a.key_secret)
        thread.join(30)
        assert status == 200
        assert body.count(b"event: token") == ENTRIES and body.count(b"event: end") == 1
        growth = _peak_rss(pid) - before
        assert growth < MAX_GROWTH_BYTES, f"the replay raised the web process's peak memory by {growth >> 20} MiB"
        assert canary == {"status": 200, "seconds": canary["seconds"]} and canary["seconds"] < CANARY_S, canary
    finally:
        client.delete(key)
