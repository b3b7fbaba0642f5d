"""One synchronous Redis client (connection pool) per process and server URL, and one asyncio
client per event loop and server URL.

Why not ``redis.Redis.from_url`` per call: each call builds a pool whose connection stays open
until the garbage collector finds it, so under load a web process held hundreds of idle Redis
connections long after the requests that opened them. One pool per process reuses them; its
size is bounded by the threads using it at once.
"""

from __future__ import annotations

import asyncio
import functools
import threading

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

#: Longest wait for one Redis reply (a hung server must not hang a request or a task for good).
SOCKET_TIMEOUT_S = 5


@functools.cache
def shared(url: str) -> redis.Redis:
    """The process's client for ``url`` (thread-safe: commands take a pooled connection each)."""
    return redis.Redis.from_url(url, socket_timeout=SOCKET_TIMEOUT_S)


#: Connections :func:`shared_async` keeps open per event loop while idle; those a burst opened
#: past it are closed as they come back (:class:`IdleBoundedPool`).
ASYNC_MAX_IDLE = 8


class IdleBoundedPool(aioredis.ConnectionPool):
    """An asyncio pool that keeps at most ``max_idle`` connections open while idle.

    redis-py's pool keeps every connection it ever opened: after a burst of event streams (one
    tenant may hold ``SYMPHONY_STREAMS_PER_TENANT`` of them, every tenant together up to the
    process's in-flight bound) the web process would hold that many idle Redis clients for
    good. Extra ones are disconnected when they are released. Relies on the pool's list of
    available connections and its lock (redis-py is pinned; tests/api/test_redis_client.py
    checks the behaviour)."""

    def __init__(self, *args: object, max_idle: int = ASYNC_MAX_IDLE, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.max_idle = max_idle

    async def release(self, connection: aioredis.connection.AbstractConnection) -> None:
        await super().release(connection)
        extra = []
        async with self._lock:
            while len(self._available_connections) > self.max_idle:
                extra.append(self._available_connections.pop(0))
        for idle in extra:
            await idle.disconnect()


_async_lock = threading.Lock()
_async_clients: dict[asyncio.AbstractEventLoop, dict[str, aioredis.Redis]] = {}


def shared_async(url: str) -> aioredis.Redis:
    """The running event loop's asyncio client for ``url``.

    Why: every ``/v1`` request took a stream lease, waited on its run's stream and gave the
    lease back, each through a client of its own, so three fresh Redis connections (connect and
    handshake, ~1.2 ms each here) were on the path of every answer. Connections are pooled and
    reused instead, at most :data:`ASYNC_MAX_IDLE` kept while idle; a blocking read holds one
    only while it waits, as before. The pool's ceiling (twice the process's bound on requests
    in flight: a request's stream read and its lease refresh) is never what refuses a request.
    Per loop, because an asyncio connection belongs to the loop that opened it; clients of
    closed loops (tests run many) are dropped here, their sockets closed when collected."""
    loop = asyncio.get_running_loop()
    with _async_lock:
        for closed in [other for other in _async_clients if other.is_closed()]:
            del _async_clients[closed]
        clients = _async_clients.setdefault(loop, {})
        client = clients.get(url)
        if client is None:
            from django.conf import settings

            ceiling = 2 * settings.SYMPHONY_MAX_INFLIGHT_TOTAL + 16
            pool = IdleBoundedPool.from_url(
                url,
                max_connections=ceiling,
                socket_timeout=SOCKET_TIMEOUT_S,
                # A pooled connection Redis has closed meanwhile (a restart, an idle timeout)
                # fails its next command once; that command is sent again on a fresh one. Every
                # command sent through this client is safe to repeat (reads, and lease scripts
                # that are idempotent by lease id: api/services/stream_leases.py).
                retry=Retry(NoBackoff(), 1),
                retry_on_error=[redis.exceptions.ConnectionError],
            )
            client = clients[url] = aioredis.Redis(connection_pool=pool)
        return client
