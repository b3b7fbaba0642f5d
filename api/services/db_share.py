"""Each account's share of the web process's database connections.

The web process takes its PostgreSQL connections from one bounded pool
(``DATABASE_POOL_MAX_SIZE``, web/asgi.py); a request waits for a free one. Without a per-account
bound, one person's concurrent requests took every connection and another tenant's ``/quota``
waited behind them (0.03 s became 0.34 s, spikes of 4 s). So the pool is a shared pool of the
resource model (gpu_worker/resource_model.py, ``PoolName.DB_CONNECTIONS``) whose capacity is the
pool's size, read when the process starts: an account (a person's tenants,
``Tenant.account_key``) may have at most the pool's ``ceiling`` of requests using the database at
once, and the ``reserve`` stays for everyone else. Past it a request is refused at once (429)
rather than queued for a connection.

A request with an API key is admitted before its key is looked up (the lookup takes a pooled
connection too, which the request's thread then keeps): its account is known from a cache of key
-> account (api/services/key_accounts.py), and a key not in it yet is looked up in the share of
:data:`UNIDENTIFIED`, which every such lookup shares. So no flood of valid keys' requests takes
more than a ceiling of the pool doing lookups (tests/reliability/test_db_share.py). A console
request is admitted the same way before its session is read (api/services/session_accounts.py),
sessions not known yet in the share of :data:`UNIDENTIFIED_SESSIONS`.

Counted per process, as the pool is: each web process has its own connections. What they all
draw from is PostgreSQL's ``max_connections``; ``manage.py check --deploy`` refuses a deploy whose
web processes' pools and other connections do not fit in it (api/checks.py, ``api.E102``). With
no pool (``DATABASE_POOL_MAX_SIZE=0``: a connection per request, bounded only by PostgreSQL)
nothing is counted.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from django.conf import settings

from gpu_worker.resource_model import Pool, PoolName

#: The share that lookups of API keys whose account is not known yet count against.
UNIDENTIFIED = "unidentified-keys"
#: The share that reads of console sessions whose account is not known yet count against.
UNIDENTIFIED_SESSIONS = "unidentified-sessions"
#: How a refusal names each of those shares.
_UNIDENTIFIED_WHOSE = {
    UNIDENTIFIED: "API keys not seen here recently have",
    UNIDENTIFIED_SESSIONS: "console sessions not seen here recently have",
}


class AccountOverShare(Exception):
    """The account has its ceiling of requests using the database in this process."""

    def __init__(self, held: int, pool: Pool, account: str) -> None:
        whose = _UNIDENTIFIED_WHOSE.get(account, "this account has")
        super().__init__(
            f"{whose} {held} requests using the database at once, the most one account may"
            f" (its share of the web process's {pool.capacity} database connections; {pool.reserve} are kept"
            " for others); retry in 1 s"
        )
        self.held, self.pool, self.account = held, pool, account


@dataclass
class DbShareLease:
    """One admitted request's place in its account's share; :meth:`release` once."""

    share: DbShare
    account: str
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.share.release(self.account)


class DbShare:
    """The per-account count of requests using the database, against one pool."""

    def __init__(self, capacity: int) -> None:
        self.pool = Pool(PoolName.DB_CONNECTIONS, capacity)
        self._lock = threading.Lock()
        self._held: dict[str, int] = {}

    def acquire(self, account: str) -> DbShareLease:
        """Count one request of ``account``, or :class:`AccountOverShare` at its ceiling."""
        with self._lock:
            held = self._held.get(account, 0)
            if held >= self.pool.ceiling:
                raise AccountOverShare(held, self.pool, account)
            self._held[account] = held + 1
        return DbShareLease(self, account)

    def release(self, account: str) -> None:
        with self._lock:
            left = self._held.get(account, 0) - 1
            if left > 0:
                self._held[account] = left
            else:
                self._held.pop(account, None)

    def held(self, account: str) -> int:
        with self._lock:
            return self._held.get(account, 0)


_share: DbShare | None = None
_share_lock = threading.Lock()


def web_share() -> DbShare | None:
    """This process's share, sized from its connection pool; ``None`` without a pool."""
    global _share
    capacity = int(getattr(settings, "DATABASE_POOL_MAX_SIZE", 0) or 0)
    if capacity < 2:  # no pool, or one connection: nothing to share out
        return None
    with _share_lock:
        if _share is None or _share.pool.capacity != capacity:
            _share = DbShare(capacity)
        return _share


def admit_key_lookup(account: str | None) -> DbShareLease | None:
    """A place for looking up an API key, in the share of ``account`` (its key's account as
    last seen, api/services/key_accounts.py) or, unknown, of :data:`UNIDENTIFIED`;
    :class:`AccountOverShare` when that share is full, ``None`` without a pool."""
    share = web_share()
    return None if share is None else share.acquire(account or UNIDENTIFIED)


def admit_session_read(account: str | None) -> DbShareLease | None:
    """A place for reading a console session and its user, in the share of ``account`` (the
    session's account as last seen, api/services/session_accounts.py) or, unknown, of
    :data:`UNIDENTIFIED_SESSIONS`; :class:`AccountOverShare` when that share is full, ``None``
    without a pool."""
    share = web_share()
    return None if share is None else share.acquire(account or UNIDENTIFIED_SESSIONS)
