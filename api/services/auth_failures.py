"""Service-wide counts of refused credentials, kept in the shared cache (Redis) for ``/metrics``.

Why not counters in the web process: there are many web processes, and one that restarts would
forget. Every web process increments the same keys, and any of them answers a scrape with the
same totals. A cache flush restarts them at zero, which Prometheus' ``rate()`` reads as a
counter reset. The per-address throttles (api/authentication.py, DRF's ``auth`` scope) stop a
single guesser; these totals let an alert see guessing spread over many addresses.
"""

from __future__ import annotations

import logging

from django.core.cache import cache

log = logging.getLogger(__name__)

#: reason -> what it counts.
REASONS = {
    "bad_api_key": "a bearer key that is wrong, malformed, revoked or expired (401)",
    "throttled_api_key": "a bearer key refused because its address sent too many wrong ones (429)",
    "bad_login": "a console sign-in with a wrong email or password (401)",
}
_PREFIX = "metrics:auth_failures:"


def record(reason: str) -> None:
    """Count one refusal; never fails the request it is counted for (a cache outage only
    loses the count)."""
    if reason not in REASONS:
        raise ValueError(f"unknown auth failure reason {reason!r}")
    key = _PREFIX + reason
    try:
        cache.add(key, 0, timeout=None)
        cache.incr(key)
    except Exception as exc:  # a metric must not turn a 401 into a 500
        log.warning("event=auth_failure_not_counted reason=%s error=%r", reason, exc)


def totals() -> dict[str, int]:
    """Every reason's count so far (0 for those never seen)."""
    found = cache.get_many([_PREFIX + reason for reason in REASONS])
    return {reason: int(found.get(_PREFIX + reason, 0)) for reason in REASONS}
