"""One synchronous Redis client (connection pool) per process and server URL.

Why not ``redis.Redis.from_url`` per call: each call builds a pool whose connection stays open
until the garbage collector finds it, so under load a web process held hundreds of idle Redis
connections long after the requests that opened them. One pool per process reuses them; its
size is bounded by the threads using it at once.
"""

from __future__ import annotations

import functools

import redis

#: Longest wait for one Redis reply (a hung server must not hang a request or a task for good).
SOCKET_TIMEOUT_S = 5


@functools.cache
def shared(url: str) -> redis.Redis:
    """The process's client for ``url`` (thread-safe: commands take a pooled connection each)."""
    return redis.Redis.from_url(url, socket_timeout=SOCKET_TIMEOUT_S)
