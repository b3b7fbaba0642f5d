"""Per-account sign-in lockout with exponential back-off, across every client address.

The per-address ``auth`` throttle stops one guesser; it does not stop many addresses taking turns
at one account (95 wrong passwords from 5 addresses, then the right one, was accepted). Here the
failed sign-ins of an account (its username as :func:`api.services.accounts.login_name` resolves
what was typed, so "Ada@X.org" and "ada@x.org" are one account) are counted in the shared cache
(Redis), whatever address sent them. After ``SYMPHONY_LOGIN_LOCK_AFTER`` (10) failures the
account's password sign-in is locked for ``SYMPHONY_LOGIN_LOCK_FIRST_S`` (60 s); each failure
after a lock ends locks it again for twice as long, up to ``SYMPHONY_LOGIN_LOCK_MAX_S`` (1 h).
While locked every attempt is answered 429 ``account_locked`` with the same message and
``Retry-After``, before the password is looked at, so the answer tells a guesser nothing. A
success outside a lock, or a completed password reset (the mailed link proves the owner), clears
the count.

Someone who knows the address can keep the owner from signing in with a password for as long as
they keep failing (at most the longest lock per failure); the reset link still gets the owner in,
and clears the lock. A cache outage lets sign-ins through uncounted (the per-address throttle
fails the same way): an outage of the counter must not become an outage of sign-in.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time

from django.conf import settings
from django.core.cache import cache

from api.services import shared_counters

log = logging.getLogger(__name__)

#: How long failures are remembered after the last one.
FAILURE_MEMORY_S = 24 * 3600
#: Sign-ins refused because their account was locked (``/metrics``).
LOCKED_COUNTER = "login_locked"


class AccountLocked(Exception):
    """The account's password sign-in is locked for ``retry_after`` more seconds."""

    message = "too many failed sign-ins for this account: try again later, or reset the password by email"

    def __init__(self, retry_after: int) -> None:
        super().__init__(self.message)
        self.retry_after = retry_after


def _keys(username: str) -> tuple[str, str]:
    digest = hashlib.sha256(username.strip().lower().encode()).hexdigest()[:24]
    return f"login_failures:{digest}", f"login_locked_until:{digest}"


def lock_seconds(failures: int) -> int:
    """How long ``failures`` consecutive failures lock the account (0: not yet)."""
    over = failures - settings.SYMPHONY_LOGIN_LOCK_AFTER
    if over < 0:
        return 0
    return min(settings.SYMPHONY_LOGIN_LOCK_MAX_S, settings.SYMPHONY_LOGIN_LOCK_FIRST_S * 2 ** min(over, 32))


def check(username: str, now: float | None = None) -> None:
    """Raise :class:`AccountLocked` while ``username``'s sign-in is locked."""
    _, lock_key = _keys(username)
    try:
        until = cache.get(lock_key)
    except Exception as exc:
        log.warning("login_lock_unchecked error=%s", exc)
        return
    left = (float(until) - (time.time() if now is None else now)) if until is not None else 0
    if left > 0:
        shared_counters.increment(LOCKED_COUNTER)
        raise AccountLocked(max(1, math.ceil(left)))


def record_failure(username: str, now: float | None = None) -> None:
    """Count one wrong password; raise :class:`AccountLocked` when it locks the account."""
    failures_key, lock_key = _keys(username)
    try:
        failures = shared_counters.incr(failures_key, FAILURE_MEMORY_S)
        seconds = lock_seconds(failures)
        if seconds:
            now = time.time() if now is None else now
            cache.set(lock_key, now + seconds, timeout=seconds + 1)
    except Exception as exc:
        log.warning("login_failure_uncounted error=%s", exc)
        return
    if seconds:
        log.warning("login_locked account_hash=%s failures=%s seconds=%s", lock_key[-24:], failures, seconds)
        raise AccountLocked(seconds)


def clear(username: str) -> None:
    """Forget the account's failures and lift its lock (a success, or a completed reset)."""
    try:
        cache.delete_many(list(_keys(username)))
    except Exception as exc:
        log.warning("login_lock_not_cleared error=%s", exc)
