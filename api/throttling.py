"""Requests per minute per tenant: every API key and member of a tenant share its plan's
``api_requests_per_minute`` on the control plane (REST API, run events, OpenAI endpoints).

Why per tenant and not per key: a tenant can mint keys, and one tenant's runaway client loop must
not take the web processes' time from the others (the plan's run limits only bound runs, not
the listing, polling and streaming around them). Counted in a fixed one-minute window in the
shared cache (Redis), so every web process enforces the same budget. Past it a request gets 429
``throttled`` with ``Retry-After`` until the window ends.

A cache that cannot be reached lets requests through: an outage of the counter must not become
an outage of the API (the per-address guards in api/authentication.py fail the same way).
"""

from __future__ import annotations

import logging
import math
import time

from django.core.cache import cache
from rest_framework import exceptions
from rest_framework.throttling import BaseThrottle

from api.models import Tenant
from api.services import shared_counters
from api.services.quotas import plan_limits

log = logging.getLogger(__name__)

WINDOW_S = 60
#: Requests refused for their tenant's rate, service-wide (``symphony_requests_throttled_total``).
THROTTLED_COUNTER = "tenant_rate_throttled"


class TenantThrottled(Exception):
    """The tenant used its requests for this minute."""

    def __init__(self, limit: int, retry_after: int) -> None:
        super().__init__(f"this tenant's plan allows {limit} API requests per minute; retry in {retry_after} s")
        self.limit = limit
        self.retry_after = retry_after


def _count(key: str) -> int:
    cache.add(key, 0, timeout=WINDOW_S + 5)
    try:
        return cache.incr(key)
    except ValueError:  # expired between add and incr
        cache.add(key, 1, timeout=WINDOW_S + 5)
        return 1


def check_tenant_rate(tenant: Tenant) -> None:
    """Count one request of ``tenant``; :class:`TenantThrottled` when it is over its plan's rate."""
    limit = plan_limits(tenant).api_requests_per_minute
    if limit is None:
        return
    now = time.time()
    window_start = int(now // WINDOW_S * WINDOW_S)
    try:
        count = _count(f"throttle_tenant_{tenant.pk}_{window_start}")
    except Exception as exc:  # the cache is down: let the request through
        log.warning("tenant_rate_unchecked tenant=%s error=%s", tenant.slug, exc)
        return
    if count > limit:
        shared_counters.increment(THROTTLED_COUNTER)
        raise TenantThrottled(limit, max(1, math.ceil(window_start + WINDOW_S - now)))


class TenantRateThrottle(BaseThrottle):
    """DRF's side of :func:`check_tenant_rate` (DEFAULT_THROTTLE_CLASSES): requests without a
    tenant (anonymous, or a user in none) are left to the views' own checks."""

    def allow_request(self, request, view) -> bool:
        # Here, not at the top: api.tenancy imports DRF's views, whose APIView reads
        # DEFAULT_THROTTLE_CLASSES, which names this module.
        from api.tenancy import active_tenant

        if not (request.user and request.user.is_authenticated):
            return True
        try:
            tenant = active_tenant(request)
        except exceptions.PermissionDenied:
            return True
        try:
            check_tenant_rate(tenant)
        except TenantThrottled as throttled:
            # Raised rather than returned False, so the message names the limit.
            raise exceptions.Throttled(wait=throttled.retry_after, detail=str(throttled)) from None
        return True
