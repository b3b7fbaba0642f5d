"""Which account a console session's requests count against, known before the session is read.

The console signs people in with Django's database-backed sessions: reading a request's session
and its user takes a pooled database connection, like an API key's lookup. So a console request
takes its place in its account's share of the web process's database connections
(api/services/db_share.py) *before* that read, and the account must be known without the
database. This keeps ``session -> account`` (``u<user id>``, the person's account) in the shared
cache (Redis), written when a session is read and found signed in, under a digest of the
session key rather than the key itself (the cache is not where sign-ins live).

It decides nothing but whose share a read waits in: the session is still read from the
database on every request (signed out, password changed, user removed: refused at once, as
before). A session not in the cache waits in the share of
:data:`api.services.db_share.UNIDENTIFIED_SESSIONS`, which all such reads share: a flood of
made-up session cookies takes no more of the pool than one account's ceiling. An unreachable
cache leaves every session unidentified.
"""

from __future__ import annotations

import hashlib
import logging

from django.conf import settings
from django.core.cache import cache

log = logging.getLogger(__name__)


def cache_name(session_key: str) -> str:
    """The cache entry of ``session_key``'s account: a digest, so the cache holds no sign-in."""
    digest = hashlib.sha256(session_key.encode(errors="replace")).hexdigest()[:40]
    return f"console_session_account_{digest}"


def remembered(session_key: str) -> str | None:
    """The account ``session_key`` was last seen signed in to, or ``None`` (unknown, or the
    cache is down)."""
    try:
        account = cache.get(cache_name(session_key))
    except Exception as exc:  # the cache is down: the session stays unidentified
        log.warning("session_account_unread error=%s", exc)
        return None
    return account if isinstance(account, str) else None


def remember(session_key: str, account: str) -> None:
    """Note that ``session_key`` is signed in to ``account``, for ``SESSION_COOKIE_AGE`` at most
    (a session does not outlive its cookie)."""
    ttl = min(int(settings.SYMPHONY_KEY_ACCOUNT_CACHE_S), int(settings.SESSION_COOKIE_AGE))
    try:
        cache.set(cache_name(session_key), account, ttl)
    except Exception as exc:
        log.warning("session_account_unremembered error=%s", exc)
