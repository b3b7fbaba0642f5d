"""Counters that every web process increments in the shared cache (Redis), read by ``/metrics``.

Why not counters in the web process: there are many web processes, and one that restarts would
forget. Every web process increments the same keys, and any of them answers a scrape with the
same totals. A cache flush restarts them at zero, which Prometheus' ``rate()`` reads as a counter
reset. Counting never fails the request it counts (a cache outage only loses the count).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from django.core.cache import cache

log = logging.getLogger(__name__)

_PREFIX = "metrics:"


def incr(key: str, timeout: int | None) -> int:
    """Add one to the cache counter ``key`` (created with ``timeout``, ``None``: never expires)
    and return its new value; raises what the cache raises. The throttles count with it too."""
    cache.add(key, 0, timeout=timeout)
    try:
        return cache.incr(key)
    except ValueError:  # expired between add and incr
        cache.add(key, 1, timeout=timeout)
        return 1


def increment(name: str) -> None:
    try:
        incr(_PREFIX + name, None)
    except Exception as exc:  # a metric must not turn a 401 or a 429 into a 500
        log.warning("event=counter_not_incremented name=%s error=%r", name, exc)


def read(names: Iterable[str]) -> dict[str, int]:
    """Each counter's total so far (0 for those never incremented)."""
    names = list(names)
    found = cache.get_many([_PREFIX + name for name in names])
    return {name: int(found.get(_PREFIX + name, 0)) for name in names}
