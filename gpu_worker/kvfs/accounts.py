"""Accounts on the device page pool: whose pages count together, and who contends now.

A tenant's device pages count against its *account* (a person's tenants together, as the
control plane names it in the session limits; gpu_worker/resource_model.py). Per account:

* it never holds more than the pool's **ceiling** (``capacity - reserve``), alone or not, so
  the reserve is always left to the other accounts' prefills and decodes;
* while another account is *active* (has a live session on this worker), what it holds above
  its **fair share** (``Pool.fair_share(weight, active weights)``) is what gives way: its idle
  unpinned files are the ones spilled, and it takes new pages only while the reserve stays
  free for the others (else ENOSPC naming the share), never by spilling an active account's
  files.

The bounds apply to the tenants whose sessions joined (``KVFS.set_session_limit``, which the
worker calls for every run).

Pages are those the allocator counts for the account's tenants: every page a file of theirs
references (forks and copy-on-write sharers included, a page shared by several files counted
once, as pages never cross tenants) and the pages only their prefix cache holds, which are
reclaimed first whenever the account is over a bound.

An account's weight is the largest of its live sessions' weights (the plan's): running more
runs at once never buys a person a larger share.
"""

from __future__ import annotations

from collections.abc import Callable

from gpu_worker.kvfs.files import Owner
from gpu_worker.resource_model import RESERVE_FRACTION, Pool, PoolName


def default_account(tenant: str) -> str:
    """The account of a tenant the control plane named none for: the tenant alone (the same
    key ``WorkerSession.account`` uses)."""
    return f"tenant:{tenant}"


class Accounts:
    """Tenant -> account, and the live sessions of each account with their weights."""

    def __init__(self) -> None:
        self._account_of: dict[str, str] = {}
        self._sessions: dict[Owner, tuple[str, float]] = {}

    def join(self, owner: Owner, account: str | None, weight: float) -> None:
        """Register a live session: its tenant counts against ``account`` (``None``: its own)
        from now on, and the account is active while the session lives."""
        name = account or default_account(owner.tenant)
        self._account_of[owner.tenant] = name
        self._sessions[owner] = (name, weight)

    def leave(self, owner: Owner) -> None:
        self._sessions.pop(owner, None)

    def bounded(self, tenant: str) -> bool:
        """Whether the tenant's pages are bounded per account: it has had a session here (every
        run on the worker has; KVFS used on its own, as in unit tests, bounds no account)."""
        return tenant in self._account_of

    def of(self, tenant: str) -> str:
        return self._account_of.get(tenant, default_account(tenant))

    def tenants(self, account: str) -> list[str]:
        """The tenants known to count against ``account`` (a tenant never seen alone is its own)."""
        known = [t for t, a in self._account_of.items() if a == account]
        if account.startswith("tenant:") and account[len("tenant:") :] not in self._account_of:
            known.append(account[len("tenant:") :])
        return known

    def active_weights(self) -> dict[str, float]:
        """Each active account's weight (its largest live session's)."""
        weights: dict[str, float] = {}
        for account, weight in self._sessions.values():
            weights[account] = max(weight, weights.get(account, 0.0))
        return weights


class DeviceShares:
    """The device page bounds of each account, from the pool's capacity and who is active."""

    def __init__(
        self,
        capacity: int,
        accounts: Accounts,
        tenant_pages: Callable[[str], int],
        reserve_fraction: float = RESERVE_FRACTION,
    ) -> None:
        # No reserve at all (a worker serving one account) also drops the one-page minimum.
        self.pool = Pool(
            PoolName.DEVICE_KV_PAGES,
            capacity,
            reserve_fraction=reserve_fraction,
            min_reserve=1 if reserve_fraction else 0,
        )
        self.accounts = accounts
        self._tenant_pages = tenant_pages

    def held(self, account: str) -> int:
        return sum(self._tenant_pages(t) for t in self.accounts.tenants(account))

    def contended(self, account: str) -> bool:
        """Another account has a live session on this worker."""
        return any(a != account for a in self.accounts.active_weights())

    def fair_share(self, account: str) -> int:
        """What ``account`` is guaranteed while the active accounts contend (the ceiling when
        none does: an idle account's share is lent to whoever is busy)."""
        weights = self.accounts.active_weights()
        if not any(a != account for a in weights):
            return self.pool.ceiling
        weight = weights.get(account, 1.0)
        total = sum(w for a, w in weights.items() if a != account) + weight
        return self.pool.fair_share(weight, total)

    def over_share(self, account: str, adding: int = 0) -> bool:
        """The account would hold more than its fair share while another account is active."""
        return self.contended(account) and self.held(account) + adding > self.fair_share(account)

    def describe(self, account: str) -> str:
        """The bound, in the words an ENOSPC names it with."""
        held, pool = self.held(account), self.pool
        text = (
            f"this account holds {held} of the worker's {pool.capacity} device pages; one account may hold "
            f"at most {pool.ceiling} ({pool.reserve} are kept for the others)"
        )
        if self.contended(account):
            text += f"; its share under contention is {self.fair_share(account)}"
        return text
