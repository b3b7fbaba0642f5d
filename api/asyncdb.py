"""Database calls from async views that hold no connection afterwards.

Under ASGI each request runs its synchronous code on a thread of its own (asgiref's
``ThreadSensitiveContext``), and that thread's connection stays open until the request ends. For
a stream that is the run's whole life: a few hundred waiting streams held as many PostgreSQL
connections and every other request got "too many clients". :func:`db_call` closes the
connection as soon as the call returns, so a waiting stream holds none.
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
