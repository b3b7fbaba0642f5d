"""The shared cache's backend: Django's Redis cache with one bounded connection pool per process.

Django's ``RedisCache`` builds a connection pool per cache object and never closes it, and under
ASGI the cache objects are per request (``caches`` is context-local): every request opened a
Redis connection of its own and left it open until the garbage collector found it (hundreds
after a burst of streams, still open after their clients had gone). Here every cache object of
the process draws from one pool per server URL, of at most ``max_connections``
(``SYMPHONY_CACHE_MAX_CONNECTIONS``): a request finding them all busy waits up to the pool's
``timeout`` for one, then its cache call fails (the throttles let it through uncounted).
"""

from __future__ import annotations

import threading
from typing import Any

from django.core.cache.backends.redis import RedisCache, RedisCacheClient

_POOLS: dict[str, Any] = {}
_LOCK = threading.Lock()


class _SharedPoolClient(RedisCacheClient):
    def _get_connection_pool(self, write: bool) -> Any:
        url = self._servers[self._get_connection_pool_index(write)]
        with _LOCK:
            pool = _POOLS.get(url)
            if pool is None:
                pool = _POOLS[url] = self._pool_class.from_url(url, **self._pool_options)
        return pool


class SharedPoolRedisCache(RedisCache):
    """``django.core.cache.backends.redis.RedisCache`` whose connections are pooled per process."""

    def __init__(self, server: str, params: dict[str, Any]) -> None:
        super().__init__(server, params)
        self._class = _SharedPoolClient
