"""Which account an API key's requests count against, known before the key is looked up.

A request with an API key takes its place in its account's share of the web process's database
connections (api/services/db_share.py) before the key is looked up, since the lookup takes a
pooled connection itself. So the account must be known without the database: this keeps
``key prefix -> account`` in the shared cache (Redis), read in the same round trip as the
bad-key guard's counts (api/authentication.py), written when a key is verified and its account
is not the one remembered.

It decides nothing but whose share a lookup waits in: the key is still verified against the
database on every request (revoked, expired, closed tenant: refused at once, as before), and
once verified the request is counted against its tenant's actual account
(api/db_admission.py). A stale or missing entry only makes one lookup count against another
share; an unreachable cache leaves every key unidentified.
"""

from __future__ import annotations

import logging
import re

from django.conf import settings
from django.core.cache import cache

log = logging.getLogger(__name__)

#: A key's prefix as :func:`api.services.keys.issue_key` mints it (hex, 12 characters today).
_PREFIX = re.compile(r"[0-9a-f]{1,16}")


def prefix_of(secret: str) -> str | None:
    """The prefix of ``sk_<prefix>_<secret>``, or ``None`` when it is not one a key could have."""
    parts = secret.split("_", 2)
    if len(parts) != 3 or parts[0] != "sk" or not _PREFIX.fullmatch(parts[1]):
        return None
    return parts[1]


def cache_name(prefix: str) -> str:
    """The cache entry of ``prefix``'s account (a name for ``cache.get_many``)."""
    return f"api_key_account_{prefix}"


def remember(prefix: str, account: str) -> None:
    """Note that key ``prefix`` belongs to ``account``, for ``SYMPHONY_KEY_ACCOUNT_CACHE_S``."""
    try:
        cache.set(cache_name(prefix), account, settings.SYMPHONY_KEY_ACCOUNT_CACHE_S)
    except Exception as exc:  # the cache is down: the key stays unidentified
        log.warning("key_account_unremembered error=%s", exc)
