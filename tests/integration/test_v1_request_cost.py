"""What one ``/v1`` request costs the control plane, counted through the real stack: a request
goes through the real ASGI application (web/asgi.py) in this process, runs the built-in program
in-process (api/services/trusted_runs.py) against a real worker on the tiny model, and uses the
real PostgreSQL and Redis. Every SQL statement and transaction (all threads of this process),
every Redis round trip (sync and asyncio clients: the shared ones, the cache, the broker) and
every request to the worker (admin socket and session socket) is counted, and each count is held
under a ceiling, so a change that adds a statement or a round trip to the path of every answer
fails here. docs/ARCHITECTURE.md §3a ("What a /v1 request costs") says why each one remains.

Timer-driven work (the executor heartbeat's refreshes, the cancel watch's polls, a stream
lease's keep-alive) and the stream reads while the run generates depend on how long the run
takes, not on the path; they are counted apart and bounded loosely.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis.asyncio.connection as async_connection
import redis.connection as sync_connection
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper

from api.services import trusted_runs
from gpu_worker.admin_client import AdminClient
from tests.plugins.worker import RunningWorker
from web.asgi import application

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.integration,
    pytest.mark.vllm,
    pytest.mark.timeout(300),
]

#: Ceilings per request (after the tenant's first request, which creates its built-in program).
#: Lower them when the path gets cheaper; never raise one without saying why in
#: docs/ARCHITECTURE.md §3a.
CEILINGS = {
    "chat": {"statements": 14, "transactions": 2, "redis": 8, "redis_setup": 0, "worker": 9},
    "chat_stream": {"statements": 14, "transactions": 2, "redis": 8, "redis_setup": 0, "worker": 9},
    "responses": {"statements": 15, "transactions": 2, "redis": 8, "redis_setup": 0, "worker": 9},
    "responses_stored": {"statements": 26, "transactions": 5, "redis": 8, "redis_setup": 0, "worker": 12},
}
#: Threads whose work is driven by a clock, not by the request.
TIMER_THREADS = ("executor-heartbeat-", "cancel-watch-")
#: Redis commands that read a run's stream while it generates: how many depends on timing.
STREAM_READS = frozenset({"XREAD", "XREADGROUP"})
#: What a new Redis connection sends before its first command: counted apart (a pool's
#: connections are reused; ``redis_setup`` counts them).
CONNECTION_SETUP = frozenset({"HELLO", "CLIENT", "AUTH", "SELECT"})


def _command_names(packed: Any) -> list[str]:
    """The command names in a packed RESP request (one, or a pipeline's several)."""
    if isinstance(packed, list | tuple):
        data = b"".join(bytes(chunk) for chunk in packed)
    else:
        data = bytes(packed)
    names, at = [], 0
    while at < len(data) and data[at : at + 1] == b"*":
        end = data.index(b"\r\n", at)
        count, at = int(data[at + 1 : end]), end + 2
        for i in range(count):
            end = data.index(b"\r\n", at)
            length = int(data[at + 1 : end])
            value = data[end + 2 : end + 2 + length]
            if i == 0:
                names.append(value.decode().upper())
            at = end + 2 + length + 2
    return names


@dataclass
class Costs:
    """What was counted: each entry ``(thread name, what)``."""

    statements: list[tuple[str, str]] = field(default_factory=list)
    transactions: list[str] = field(default_factory=list)
    redis: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)
    worker: list[tuple[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, kind: str, value: Any) -> None:
        with self.lock:
            getattr(self, kind).append((threading.current_thread().name, value))

    def clear(self) -> None:
        with self.lock:
            self.statements, self.transactions, self.redis, self.worker = [], [], [], []

    @staticmethod
    def _timer(thread: str) -> bool:
        return thread.startswith(TIMER_THREADS)

    def summary(self) -> dict[str, Any]:
        setup = [c for _, c in self.redis if CONNECTION_SETUP.issuperset(c)]
        redis_fixed = [
            c
            for t, c in self.redis
            if not self._timer(t) and not STREAM_READS.intersection(c) and not CONNECTION_SETUP.issuperset(c)
        ]
        return {
            "statements": sum(1 for t, _ in self.statements if not self._timer(t)),
            "transactions": len(self.transactions),
            "redis": len(redis_fixed),
            "worker": len(self.worker),
            "redis_stream_reads": sum(1 for t, c in self.redis if STREAM_READS.intersection(c)),
            "redis_setup": len(setup),
            "redis_timer": sum(1 for t, _ in self.redis if self._timer(t)),
            "redis_commands": Counter("+".join(c) for c in redis_fixed),
            "worker_ops": Counter(op for _, op in self.worker),
            "threads": sorted({t for t, _ in self.statements + self.redis + self.worker}),
            "redis_by_thread": Counter(f"{t}:{'+'.join(c)}" for t, c in self.redis),
            "sql": [sql[:160] for t, sql in self.statements if not self._timer(t)],
        }


@pytest.fixture
def costs(monkeypatch) -> Iterator[Costs]:
    """Counting wrappers around the database cursor, the commit, the Redis connections' one
    send per round trip, and the worker's admin and session sockets' requests."""
    from symphony import connection as sdk_connection

    counted = Costs()

    def wrap(owner: Any, name: str, record: Any) -> None:
        original = getattr(owner, name)

        def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
            record(self, *args)
            return original(self, *args, **kwargs)

        async def counting_async(self: Any, *args: Any, **kwargs: Any) -> Any:
            record(self, *args)
            return await original(self, *args, **kwargs)

        monkeypatch.setattr(owner, name, counting_async if inspect.iscoroutinefunction(original) else counting)

    wrap(CursorWrapper, "_execute", lambda self, sql, *a: counted.add("statements", sql))
    wrap(CursorWrapper, "_executemany", lambda self, sql, *a: counted.add("statements", sql))
    wrap(BaseDatabaseWrapper, "commit", lambda self: counted.transactions.append(threading.current_thread().name))
    for module in (sync_connection, async_connection):
        wrap(
            module.AbstractConnection,
            "send_packed_command",
            lambda self, packed, *a: counted.add("redis", tuple(_command_names(packed))),
        )
    wrap(AdminClient, "call", lambda self, op, *a: counted.add("worker", f"admin:{op}"))
    wrap(sdk_connection.Connection, "_hello", lambda self, *a: counted.add("worker", "session:hello"))
    wrap(
        sdk_connection.Connection,
        "_register_and_write",
        lambda self, calls, *a: counted.add("worker", "session:" + "+".join(c.op for _, c in calls)),
    )
    yield counted


@pytest.fixture(scope="module")
def cost_worker(shared_stack_worker: RunningWorker) -> RunningWorker:
    return shared_stack_worker


@pytest.fixture
def in_process(settings, cost_worker, monkeypatch) -> Iterator[None]:
    """The web process's default path: the built-in program in this process, on the local worker."""
    settings.SYMPHONY_WORKER_ADMIN_SOCKET = cost_worker.admin_socket
    settings.SYMPHONY_WORKER_NAME = cost_worker.name
    settings.SYMPHONY_ROUTING = "static"
    settings.SYMPHONY_TRUSTED_BUILTIN = True
    settings.SYMPHONY_TRUSTED_THREADS = 1
    monkeypatch.setattr(trusted_runs, "_pool", None)
    monkeypatch.setattr(trusted_runs, "_slots", None)
    assert trusted_runs.available()
    yield
    if trusted_runs._pool is not None:  # its one thread keeps a connection for its next run
        trusted_runs._pool.submit(connections.close_all).result()
        trusted_runs._pool.shutdown()


async def _settled() -> None:
    """Until no in-process run thread is busy: a run's thread still syncs KV files after the
    answer went out, and that is part of what the request cost."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        slots = trusted_runs._slots
        if slots is None or slots._value == trusted_runs.settings.SYMPHONY_TRUSTED_THREADS:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("an in-process run thread did not finish")


async def _post(path: str, secret: str, body: dict) -> tuple[int, bytes]:
    """One request through the ASGI application on the running event loop (as uvicorn serves
    every request of a process on one loop: its pooled Redis connections are per loop)."""
    sent: list[MutableMapping[str, Any]] = []
    bodies = [{"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}]

    async def receive() -> dict:
        if bodies:
            return bodies.pop()
        await asyncio.Event().wait()  # connected until the response is sent
        raise AssertionError("unreachable")

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    headers = [(b"host", b"testserver"), (b"authorization", f"Bearer {secret}".encode())]
    headers.append((b"content-type", b"application/json"))
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }
    await application(scope, receive, send)
    await _settled()
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


CHAT = {"model": "m", "messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 4, "temperature": 0}
# Greedy, as CHAT: sampled (the Responses API's default temperature is 1) an answer sometimes
# ends in half a character, which the worker holds back and the program then sends itself (one
# more round trip that says nothing about the path).
RESPONSE = {"model": "m", "input": "Name a colour.", "max_output_tokens": 4, "temperature": 0}
REQUESTS = {
    "chat": ("/v1/chat/completions", CHAT),
    "chat_stream": ("/v1/chat/completions", {**CHAT, "stream": True}),
    "responses": ("/v1/responses", {**RESPONSE, "store": False}),
    # Stored (the Responses API's default): its row, its conversation's KV file and its mirror.
    "responses_stored": ("/v1/responses", RESPONSE),
}


def test_a_v1_request_stays_within_its_statement_and_round_trip_ceilings(api_tenant_a, in_process, costs):
    tenant = api_tenant_a.tenant
    # An account's tenant, as console sign-up makes one: its runs count against the account too.
    tenant.account = api_tenant_a.user
    tenant.save(update_fields=["account"])
    secret = api_tenant_a.key_secret
    measured: dict[str, dict[str, Any]] = {}

    async def scenario() -> None:
        # The first request creates the tenant's built-in program and opens pooled connections.
        status, answer = await _post("/v1/chat/completions", secret, CHAT)
        assert status == 200, answer[:500]
        for name, (path, body) in REQUESTS.items():
            costs.clear()
            status, answer = await _post(path, secret, body)
            assert status == 200, (name, answer[:500])
            if body.get("stream"):
                assert answer.rstrip().endswith(b"data: [DONE]"), answer[-300:]
            measured[name] = costs.summary()

    asyncio.run(scenario())
    for name, summary in measured.items():
        print(f"\n{name}: " + json.dumps({k: v for k, v in summary.items() if k != "sql"}, default=str))
        print("\n".join(f"  {sql}" for sql in summary["sql"]))
    for name, summary in measured.items():
        for what, ceiling in CEILINGS[name].items():
            assert summary[what] <= ceiling, (name, what, summary[what], ceiling, summary)
        # Bounded by the run's length, not by the path: at most a few per second of the run.
        assert summary["redis_timer"] <= 40, (name, summary)
        assert summary["redis_stream_reads"] <= 40, (name, summary)
        if not REQUESTS[name][1].get("stream"):
            # An answer not streamed waits for its in-process run's handoff, reading none of
            # its stream's entries (an event per token): api/services/run_handoff.py.
            assert summary["redis_stream_reads"] == 0, (name, summary)
