"""``Authorization: Bearer sk_...`` authentication. request.auth is the ApiKey; the active tenant
of such a request is the key's tenant.

Wrong keys are counted per client address (rate ``bad_api_key`` in DEFAULT_THROTTLE_RATES, in the
shared Redis cache). Past the limit that address gets 429 before any key is looked at, so a
guesser learns nothing more, valid key or not, until the window ends. DRF's own throttles cannot
do this: they run after authentication, and a failed authentication ends the request first.

Every route that takes a bearer key goes through :func:`bearer_key`: the DRF views through
:class:`ApiKeyAuthentication`, and the plain async views (run events over SSE, the OpenAI
endpoints) directly, each answering :class:`KeyRefused` in its own error envelope. A route that
verified keys on its own would be an unthrottled oracle for the same secrets.

A key is looked up within a place in its account's share of the web process's database
connections (api/services/db_share.py), taken before the lookup, whose connection the request
keeps: the account comes from the cache the guard's counts are read with, in the same round trip
(api/services/key_accounts.py).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import AnonymousUser
from django.core.cache import cache
from rest_framework import authentication, exceptions
from rest_framework.settings import api_settings

from api.db_admission import RETRY_AFTER_S, keep_lease
from api.models import ApiKey
from api.services import auth_failures, key_accounts, shared_counters
from api.services.db_share import AccountOverShare, DbShareLease, admit_key_lookup
from api.services.keys import verify_key

log = logging.getLogger(__name__)


class ApiKeyUser(AnonymousUser):
    """The principal of an API-key request: authenticated, tied to one tenant, never staff."""

    def __init__(self, key) -> None:
        self.key = key

    @property
    def is_authenticated(self) -> bool:  # type: ignore[override]
        return True


_PERIODS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _parse_rate(rate: str) -> tuple[int, int]:
    """DRF's rate syntax: ``"<count>/<s|sec|m|min|h|hour|d|day>"`` -> (count, window seconds)."""
    count, period = rate.split("/")
    return int(count), _PERIODS[period[0]]


class BadKeyGuard:
    """Sliding-window count of failed bearer keys per client address.

    Counts live in fixed windows (one cache key per window), and the guard reads them the way a
    sliding window would: this window's failures plus the previous window's, weighted by how much
    of it still overlaps the last ``window`` seconds. A plain fixed window let a guesser send
    twice the limit around each window edge (the limit just before it, the limit again just after).

    A cache that cannot be reached lets keys be checked uncounted: guessing is then as slow as
    one HMAC per request, while refusing every key would turn a cache outage into an API outage."""

    scope = "bad_api_key"

    def __init__(self, request, now: float | None = None) -> None:
        rate = api_settings.DEFAULT_THROTTLE_RATES.get(self.scope)  # "30/min"; None disables
        self.limit, self.window = _parse_rate(rate) if rate else (None, None)
        self.now = time.time() if now is None else now
        self.window_start = int(self.now // self.window * self.window) if self.window else 0
        address = request.META.get("REMOTE_ADDR", "")
        self.key = self._key(address, self.window_start)
        self.previous_key = self._key(address, self.window_start - (self.window or 0))

    def _key(self, address: str, window_start: int) -> str:
        return f"throttle_{self.scope}_{address}_{window_start}"

    def check(self, also: Sequence[str] = ()) -> dict[str, Any]:
        """Refuse the address past its limit; returns the cache entries named in ``also`` that
        exist, read in the same round trip as the counts (the key's account: key_accounts)."""
        counted = [self.key, self.previous_key] if self.limit is not None else []
        found = self._read([*counted, *also])
        if self.limit is not None:
            current, previous = int(found.get(self.key, 0)), int(found.get(self.previous_key, 0))
            wait = seconds_until_below(self.limit, self.window, self.now - self.window_start, current, previous)
            if wait > 0:
                raise exceptions.Throttled(wait=max(1, wait), detail="too many invalid API keys from this address")
        return {name: found[name] for name in also if name in found}

    @staticmethod
    def _read(names: list[str]) -> dict[str, Any]:
        if not names:
            return {}
        try:
            return cache.get_many(names)
        except Exception as exc:
            log.warning("bad_key_guard_unchecked error=%s", exc)
            return {}

    def record_failure(self) -> None:
        if self.limit is None:
            return
        try:
            # Kept two windows: the next window still weighs this one.
            shared_counters.incr(self.key, 2 * self.window)
        except Exception as exc:
            log.warning("bad_key_guard_uncounted error=%s", exc)


def seconds_until_below(limit: int, window: int, elapsed: float, current: int, previous: int) -> float:
    """Seconds until the sliding estimate ``current + previous * (1 - elapsed / window)`` drops
    below ``limit`` (0 when it already is). The estimate is rounded up, so a guesser at the
    limit is not let through by the fraction of a failure that has slid out of the window."""
    overlap = 1 - elapsed / window
    if math.ceil(current + previous * overlap) < limit:
        return 0.0
    if current < limit:  # the previous window's share has to slide out of this one
        return window * (overlap - (limit - 1 - current) / previous) if previous else 0.0
    # This window alone is over: wait for it to end, then for its share to slide out of the next.
    return window * overlap + window * (1 - (limit - 1) / current)


@dataclass
class KeyRefused(Exception):
    """A bearer key was not accepted: 401 (wrong, malformed, revoked, expired) or 429 (this
    address sent too many wrong keys; ``retry_after`` seconds until its window ends)."""

    status: int
    message: str
    retry_after: int | None = None

    def __str__(self) -> str:
        return self.message


KEYWORD = "Bearer"


def bearer_key(request) -> ApiKey | None:
    """The API key of a request's ``Authorization: Bearer`` header, ``None`` when the request
    has no bearer header (it may still carry a session), or :class:`KeyRefused`. Its place in
    the database share is given back at once: for views whose database calls each return their
    connection (the plain async views, api/asyncdb.py)."""
    key, lease = bearer_key_in_share(request)
    if lease is not None:
        lease.release()
    return key


def bearer_key_in_share(request) -> tuple[ApiKey | None, DbShareLease | None]:
    """:func:`bearer_key`, looked up within a place in the share of the process's database
    connections of the key's account (api/services/db_share.py), which the caller keeps (or
    ``None`` without a pool): the lookup takes a pooled connection, so a flood of one account's
    requests waits for none past its ceiling. 429 when the share is full."""
    header = authentication.get_authorization_header(request).decode(errors="replace").split()
    if not header or header[0] != KEYWORD:
        return None, None
    guard = BadKeyGuard(request)
    secret = header[1] if len(header) == 2 else None
    prefix = key_accounts.prefix_of(secret) if secret else None
    also = [key_accounts.cache_name(prefix)] if prefix else []
    try:
        remembered = guard.check(also)
    except exceptions.Throttled as throttled:
        auth_failures.record("throttled_api_key")
        raise KeyRefused(429, str(throttled.detail), math.ceil(throttled.wait or 1)) from None
    account = remembered.get(also[0]) if also else None
    key, lease = None, None
    if secret is not None:
        try:
            lease = admit_key_lookup(account if isinstance(account, str) else None)
        except AccountOverShare as over:
            raise KeyRefused(429, str(over), RETRY_AFTER_S) from None
        try:
            key = verify_key(secret)
        finally:
            if key is None and lease is not None:
                lease.release()
    if key is None:
        guard.record_failure()
        auth_failures.record("bad_api_key")
        raise KeyRefused(
            401, "malformed Authorization header" if len(header) != 2 else "invalid, revoked or expired API key"
        )
    if prefix is not None and account != key.tenant.account_key:
        key_accounts.remember(prefix, key.tenant.account_key)
    return key, lease


class ApiKeyAuthentication(authentication.BaseAuthentication):
    keyword = KEYWORD

    def authenticate(self, request):
        try:
            key, lease = bearer_key_in_share(request)
        except KeyRefused as refused:
            if refused.status == 429:
                raise exceptions.Throttled(wait=refused.retry_after, detail=refused.message) from None
            raise exceptions.AuthenticationFailed(refused.message) from None
        if lease is not None:  # kept until the view has answered (api/db_admission.py)
            keep_lease(request._request, lease)
        return None if key is None else (ApiKeyUser(key), key)

    def authenticate_header(self, request) -> str:
        return self.keyword
