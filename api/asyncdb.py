"""Database calls from async views that hold no connection afterwards.

Under ASGI each request runs its synchronous code on a thread of its own (asgiref's
``ThreadSensitiveContext``), and that thread's connection stays open until the request ends. For
a stream that is the run's whole life: a few hundred waiting streams held as many PostgreSQL
connections and every other request got "too many clients". :func:`db_call` closes the
connection as soon as the call returns, so a waiting stream holds none (in the web process
"closes" hands it back to the connection pool, web/asgi.py: the next call takes it again
without opening one).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from asgiref.sync import sync_to_async
from django.db import connections

T = TypeVar("T")


def _closing(fn: Callable[..., T], *args: object, **kwargs: object) -> T:
    try:
        return fn(*args, **kwargs)
    finally:
        for conn in connections.all(initialized_only=True):
            if not conn.in_atomic_block:  # a caller's transaction (a TestCase's) stays its own
                conn.close()


async def db_call(fn: Callable[..., T], *args: object, **kwargs: object) -> T:
    """``fn(*args, **kwargs)`` on the request's sync thread, its connection closed afterwards."""
    return await sync_to_async(_closing)(fn, *args, **kwargs)


async def db_call_before_next(fn: Callable[..., T], *args: object, **kwargs: object) -> T:
    """``fn(*args, **kwargs)`` on the request's sync thread, its connection left open for the
    request's next :func:`db_call`, which follows at once (nothing waits in between) and runs on
    the same thread. Why: taking a connection costs a short request a pool checkout and its
    health check (and, without the pool, opening one: ~6-10 ms on the benchmark host,
    bench/NOTES.md B11), and an OpenAI request makes two calls back to back before it starts
    waiting. Should the next call never come (an error response in between), Django closes the
    connection when the request finishes."""
    return await sync_to_async(fn)(*args, **kwargs)
