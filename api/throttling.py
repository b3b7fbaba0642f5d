"""Requests per minute per tenant: every API key and member of a tenant share its plan's
``api_requests_per_minute`` on the control plane (REST API, run events, OpenAI endpoints).

Why per tenant and not per key: a tenant can mint keys, and one tenant's runaway client loop must
not take the web processes' time from the others (the plan's run limits only bound runs, not
the listing, polling and streaming around them).

Counted in a sliding window: the tenant's accepted requests of the last ``WINDOW_S`` seconds are
kept as a sorted set in Redis, and one Lua script drops those older than the window, counts the
rest and adds this one only when it fits, in a single round trip and atomically for every web
process. So no ``WINDOW_S`` span, wherever it starts, holds more than the plan's requests. (A
fixed per-minute window let a client send the limit just before a minute boundary and again just
after it: 640 requests in 15 s on a 600/min plan.) Refused requests are not recorded, so a client
that keeps retrying is let back in as soon as its oldest request slides out. The set holds at
most the plan's rate of entries per tenant (about 60 bytes each), kept ``WINDOW_S`` after the
last request. Past the rate a request gets 429 ``throttled`` with ``Retry-After``.

Every counted response (429s included) carries the IETF draft's ``RateLimit-Limit``,
``RateLimit-Remaining`` (requests that still fit now) and ``RateLimit-Reset`` (seconds until the
oldest counted request leaves the window, so one more fits) headers, so clients can pace
themselves before they are refused (:func:`rate_limit_headers`), and OpenAI's names for them
(``x-ratelimit-*-requests``). The OpenAI endpoints add OpenAI's ``x-ratelimit-*-tokens`` for the
token budget the service enforces, the plan's monthly allowance (:class:`TokenAllowance`).

A cache that cannot be reached lets requests through: an outage of the counter must not become
an outage of the API (the per-address guards in api/authentication.py fail the same way).
"""

from __future__ import annotations

import logging
import math
import secrets
import time
from dataclasses import dataclass
from datetime import datetime

from asgiref.sync import iscoroutinefunction
from django.core.cache import cache
from django.http import HttpRequest
from django.utils import timezone
from django.utils.decorators import sync_and_async_middleware
from rest_framework import exceptions
from rest_framework.throttling import BaseThrottle

from api.db_admission import LEASE_ATTR, RETRY_AFTER_S, keep_lease
from api.models import Tenant
from api.services import shared_counters
from api.services.db_share import AccountOverShare, DbShareLease, web_share
from api.services.quotas import PlanLimits, next_period_start, plan_limits, tokens_this_month

log = logging.getLogger(__name__)

WINDOW_S = 60
#: Requests refused for their tenant's rate, service-wide (``symphony_requests_throttled_total``).
THROTTLED_COUNTER = "tenant_rate_throttled"

#: KEYS[1]: the tenant's log (member per request, score its time). ARGV: now (s), window (s),
#: limit, a unique member. Returns {accepted 0/1, requests in the window, the oldest one's time}.
#: Times are strings: Redis would truncate a Lua number in the reply to an integer.
SLIDING_WINDOW_LUA = """
local now = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
local count = redis.call('ZCARD', KEYS[1])
local accepted = 0
if count < limit then
  redis.call('ZADD', KEYS[1], now, ARGV[4])
  count = count + 1
  accepted = 1
  redis.call('EXPIRE', KEYS[1], math.ceil(window) + 1)
end
local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {accepted, count, oldest[2] or ARGV[1]}
"""


@dataclass(frozen=True)
class RateState:
    """Where a tenant stands in the current window, as the RateLimit-* headers say it."""

    limit: int
    remaining: int
    reset_s: int

    def headers(self) -> dict[str, str]:
        """The IETF draft's names, and OpenAI's for the same figures (``x-ratelimit-*-requests``,
        which the ``openai`` client and its users read; the reset as OpenAI writes a duration)."""
        return {
            "RateLimit-Limit": str(self.limit),
            "RateLimit-Remaining": str(self.remaining),
            "RateLimit-Reset": str(self.reset_s),
            "x-ratelimit-limit-requests": str(self.limit),
            "x-ratelimit-remaining-requests": str(self.remaining),
            "x-ratelimit-reset-requests": openai_duration(self.reset_s),
        }


@dataclass(frozen=True)
class TokenAllowance:
    """Where a tenant stands against its plan's monthly token allowance (``tokens_per_month``),
    the token budget the service enforces: a run is refused once it is used up, and each run's
    ``max_tokens`` is capped by what is left (api/services/quotas.py). The OpenAI endpoints say
    it in OpenAI's token headers; the window is the calendar month (UTC), not a minute."""

    limit: int
    #: The tokens used this month as the request read them: the run-creation check of the
    #: request's first attempt takes this figure rather than reading it again.
    used: int
    reset_s: int

    @property
    def remaining(self) -> int:
        return max(0, self.limit - self.used)

    def headers(self) -> dict[str, str]:
        return {
            "x-ratelimit-limit-tokens": str(self.limit),
            "x-ratelimit-remaining-tokens": str(self.remaining),
            "x-ratelimit-reset-tokens": openai_duration(self.reset_s),
        }


def note_token_allowance(tenant: Tenant, request: HttpRequest, plan: PlanLimits) -> TokenAllowance | None:
    """Leave the tenant's :class:`TokenAllowance` on ``request`` for the token headers (as it
    stands when the request starts); ``None`` when its plan has no monthly allowance. Its
    ``used`` serves the request's first run-creation check too (:func:`noted_tokens_used`)."""
    if plan.tokens_per_month is None:
        return None
    now = timezone.now()
    reset = datetime.combine(next_period_start(now.date()), datetime.min.time(), tzinfo=now.tzinfo)
    used = tokens_this_month(tenant)
    allowance = TokenAllowance(plan.tokens_per_month, used, max(1, math.ceil((reset - now).total_seconds())))
    request.symphony_tokens = allowance  # type: ignore[attr-defined]
    return allowance


def noted_tokens_used(request: HttpRequest) -> int | None:
    """The tokens used this month as :func:`note_token_allowance` read them for ``request``;
    ``None`` when it read none (a plan with no monthly allowance)."""
    allowance: TokenAllowance | None = getattr(request, "symphony_tokens", None)
    return None if allowance is None else allowance.used


def openai_duration(seconds: int) -> str:
    """``seconds`` as OpenAI's rate-limit headers write a duration (Go's form): ``"7s"``,
    ``"1m0s"``, ``"26h3m0s"``."""
    hours, rest = divmod(max(0, int(seconds)), 3600)
    minutes, rest = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{rest}s"
    return f"{minutes}m{rest}s" if minutes else f"{rest}s"


class TenantThrottled(Exception):
    """The tenant's account (all its tenants together) sent the plan's requests within the last
    minute."""

    def __init__(self, limit: int, retry_after: int) -> None:
        super().__init__(
            f"this tenant's plan allows {limit} API requests per minute, counted across every tenant of its "
            f"account; retry in {retry_after} s"
        )
        self.limit = limit
        self.retry_after = retry_after


def check_tenant_rate(
    tenant: Tenant, request: HttpRequest | None = None, plan: PlanLimits | None = None
) -> RateState | None:
    """Count one request of ``tenant``; :class:`TenantThrottled` when it is over its plan's rate.
    The requests of every tenant of one account (the person who created them) count together:
    a per-tenant window multiplied by the tenants a person can create.

    The state is also left on ``request`` for the RateLimit-* headers. ``None``: not counted
    (an unlimited plan, or the cache is down). ``plan``: the tenant's plan when the caller has
    read it already."""
    limit = (plan or plan_limits(tenant)).api_requests_per_minute
    if limit is None:
        return None
    now = time.time()
    try:
        accepted, count, oldest = count_in_window(f"throttle_account_{tenant.account_key}", limit, WINDOW_S, now)
    except Exception as exc:  # the cache is down: let the request through
        log.warning("tenant_rate_unchecked tenant=%s error=%s", tenant.slug, exc)
        return None
    state = RateState(limit, max(0, limit - count), max(1, math.ceil(oldest + WINDOW_S - now)))
    if request is not None:
        request.symphony_rate = state
    if not accepted:
        shared_counters.increment(THROTTLED_COUNTER)
        raise TenantThrottled(limit, state.reset_s)
    return state


def count_in_window(name: str, limit: int, window_s: float, now: float) -> tuple[bool, int, float]:
    """Record one request under ``name`` at ``now`` if fewer than ``limit`` were recorded in the
    ``window_s`` seconds before it (one Lua script in the shared cache's Redis); returns whether
    it was, how many the window holds now, and when the oldest of them was recorded."""
    key = cache.make_key(name)
    client = cache._cache.get_client(key, write=True)  # type: ignore[attr-defined]
    script = client.register_script(SLIDING_WINDOW_LUA)
    member = f"{now:.6f}-{secrets.token_hex(4)}"
    accepted, count, oldest = script(keys=[key], args=[repr(now), window_s, limit, member])
    return bool(accepted), int(count), float(oldest)


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
            check_tenant_rate(tenant, request._request)  # the HttpRequest the middleware sees
        except TenantThrottled as throttled:
            # Raised rather than returned False, so the message names the limit.
            raise exceptions.Throttled(wait=throttled.retry_after, detail=str(throttled)) from None
        return True


@sync_and_async_middleware
def rate_limit_headers(get_response):
    """Add the RateLimit-* headers to every response whose request was counted, and OpenAI's
    token headers where the request noted its tenant's token allowance (the OpenAI endpoints)."""

    def add_headers(request: HttpRequest, response):
        for state in (getattr(request, "symphony_rate", None), getattr(request, "symphony_tokens", None)):
            if state is not None:
                for name, value in state.headers().items():
                    response.headers.setdefault(name, value)
        return response

    if iscoroutinefunction(get_response):

        async def middleware(request: HttpRequest):
            return add_headers(request, await get_response(request))

    else:

        def middleware(request: HttpRequest):
            return add_headers(request, get_response(request))

    return middleware


class AccountDbShareThrottle(BaseThrottle):
    """DEFAULT_THROTTLE_CLASSES: one place in the request's account's share of the process's
    database connections. Requests without a tenant (anonymous, or a user in none) are left to
    the views' own checks."""

    def allow_request(self, request, view) -> bool:
        # Here, not at the top: api.tenancy imports DRF's views (see TenantRateThrottle).
        from api.tenancy import active_tenant

        share = web_share()
        if share is None or not (request.user and request.user.is_authenticated):
            return True
        held: DbShareLease | None = getattr(request._request, LEASE_ATTR, None)
        try:
            tenant = active_tenant(request)
        except exceptions.PermissionDenied:
            return True
        if held is not None and not held.released and held.account == tenant.account_key:
            return True  # admitted with its key's lookup, or a view that runs the throttles twice
        try:
            lease = share.acquire(tenant.account_key)
        except AccountOverShare as over:
            raise exceptions.Throttled(wait=RETRY_AFTER_S, detail=str(over)) from None
        # Replaces a place the key's lookup held in another share (unidentified, or stale).
        keep_lease(request._request, lease)
        return True
