"""Spill, reload and tier policy: which file leaves the device when pages are short, and where to.

The tiers (gpu_worker/kvfs/tiers.py) move a file's pages; this module decides when and whose.
Making ``n`` pages allocatable for a tenant (:meth:`Placement.reserve`) keeps within the
tenant's device budget and its account's bounds (gpu_worker/kvfs/accounts.py), reclaims
cached-only prefix pages first, then spills idle unpinned named files, least recently used
first among those the account bounds allow (:meth:`Placement.victims`). A spilled file goes to
host memory within its tenant's host share, else to disk; a spilled file is brought back onto
device pages, mapping the lead its tenant's prefix cache still holds (:meth:`Placement.ensure_device`).
It takes no lock: the ``KVFS`` facade holds its lock around every call.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

from gpu_worker.kvfs.budgets import Budgets
from gpu_worker.kvfs.catalogue import Catalogue
from gpu_worker.kvfs.errors import PoolFull
from gpu_worker.kvfs.files import DEVICE, HOST, KVFile, Owner
from gpu_worker.kvfs.pages import PageAllocator
from gpu_worker.kvfs.prefix_cache import PrefixCache
from gpu_worker.kvfs.tiers import TierMove, Tiers


def host_pages_of(file: KVFile) -> int:
    """Host-memory pages the file holds (spilled or swapped, or a clean copy)."""
    return 0 if file.host_data is None else file.host_data.shape[0]


class Placement:
    """Where each file's pages live, and what gives way when the device is short."""

    def __init__(
        self,
        alloc: PageAllocator,
        tiers: Tiers,
        catalogue: Catalogue,
        budgets: Budgets,
        prefix_cache: PrefixCache,
    ) -> None:
        self.alloc = alloc
        self.tiers = tiers
        self.catalogue = catalogue
        self.budgets = budgets
        self.prefix_cache = prefix_cache
        self.accounts = budgets.accounts
        self.shares = budgets.shares

    def reclaimable(self) -> int:
        """Device pages a new request could get now: free ones, cached-only prefix pages and
        those of idle unpinned named files (of any tenant), spilled before any refusal."""
        cached = self.prefix_cache.cached_only()
        return self.alloc.free_count + cached + sum(len(f.pages) for f in self.catalogue.evictable())

    def _fits_host_share(self, file: KVFile, need: int) -> bool:
        """Make room for ``need`` host pages within the file's tenant's host share by dropping
        the tenant's own clean copies, then moving its own older host files to disk; whether
        it fits. Only the tenant's files move, so its spills never cost another tenant."""
        cap = self.budgets.host_share_pages(file.tenant, self.tiers.host_capacity)
        if cap is None:
            return True
        if need > cap:
            return False
        own = sorted(
            (f for (t, _), f in self.catalogue.named.items() if t == file.tenant and f is not file),
            key=lambda f: f.use_seq,
        )
        used = sum(host_pages_of(f) for f in own)  # spilled files and clean copies
        for victim in [f for f in own if self.tiers.has_clean_copy(f)]:
            if used + need <= cap:
                break
            used -= host_pages_of(victim)
            self.tiers.forget_clean_copy(victim)
        for victim in [f for f in own if f.residency == HOST and not f.handles]:
            if used + need <= cap:
                break
            used -= host_pages_of(victim)
            self.tiers.to_disk(victim)
        return used + need <= cap

    def spill(self, file: KVFile) -> None:
        """Device -> host when host memory has room (within the tenant's host share, then
        making room by dropping other files' clean copies, then by moving older host files to
        disk), else disk. A file with a clean copy goes to host without a copy and needs no room."""
        if self.tiers.has_clean_copy(file):
            self.tiers.device_to_host(file)
            return
        need = len(file.pages)
        if need > self.tiers.host_capacity or not self._fits_host_share(file, need):
            self.tiers.to_disk(file)
            return
        host_files = self.catalogue.idle_on_host()
        clean = sorted(
            (f for f in self.catalogue.named.values() if self.tiers.has_clean_copy(f)), key=lambda f: f.use_seq
        )
        while self.tiers.host_capacity - self.tiers.host_used < need and clean:
            self.tiers.forget_clean_copy(clean.pop(0))
        while self.tiers.host_capacity - self.tiers.host_used < need and host_files:
            self.tiers.to_disk(host_files.pop(0))
        if self.tiers.host_capacity - self.tiers.host_used >= need:
            self.tiers.device_to_host(file)
        else:
            self.tiers.to_disk(file)

    def reserve(self, tenant: str, n: int) -> None:
        """Make ``n`` pages allocatable for ``tenant``, or raise ENOSPC: within the tenant's
        budget (if configured), within its account's bounds (gpu_worker/kvfs/accounts.py), then
        from the free pages, reclaiming cached-only prefix pages first (least recently used
        first) and then spilling idle named files by LRU (a spilled file's indexed pages become
        cached-only, so each spill is followed by a reclaim). Whose files may be spilled is the
        account bounds' to say (:meth:`victims`)."""
        budget = self.budgets.limits.device_pages_per_tenant
        if budget is not None:
            self._make_room(
                lambda: self.alloc.tenant_pages(tenant) + n - budget, [tenant], self.catalogue.evictable(tenant)
            )
            if self.alloc.tenant_pages(tenant) + n > budget:
                raise PoolFull(
                    f"device KV page budget of tenant exceeded: {self.alloc.tenant_pages(tenant)} held "
                    f"+ {n} needed > {budget} pages"
                )
        account = self.accounts.of(tenant)
        if n <= 0 or not self.accounts.bounded(tenant):
            self._reserve_free(account, n, self.accounts.bounded(tenant))
            return
        own = self.accounts.tenants(account)
        ceiling = self.shares.pool.ceiling
        self._make_room(lambda: self.shares.held(account) + n - ceiling, own, self.catalogue.evictable(tenants=own))
        if self.shares.held(account) + n > ceiling:
            raise PoolFull(f"device KV pages: {n} more refused; {self.shares.describe(account)}")
        if self.shares.over_share(account, n):
            # Above its share while others are active: only what keeps the reserve free for them.
            keep = self.shares.pool.reserve
            self._make_room(
                lambda: keep + n - self.alloc.free_count if self.shares.over_share(account, n) else 0,
                own,
                self.catalogue.evictable(tenants=own),
            )
            if self.shares.over_share(account, n) and self.alloc.free_count - n < keep:
                raise PoolFull(f"device KV pages: {n} more refused; {self.shares.describe(account)}")
        self._reserve_free(account, n)

    def _reserve_free(self, account: str, n: int, bounded: bool = True) -> None:
        """Make ``n`` pages free for ``account``, reclaiming and spilling what :meth:`victims`
        allows, or raise ENOSPC."""
        own = self.accounts.tenants(account)
        if self.alloc.free_count < n:
            victims = self.victims(account)
            cached = None if self.shares.over_share(account, n) else [None]
            self._make_room(lambda: n - self.alloc.free_count, [*own, *(cached or [])], victims)
            if self.alloc.free_count < n:
                why = f"; {self.shares.describe(account)}" if bounded else ""
                raise PoolFull(f"KV cache full: {n} pages needed, {self.alloc.free_count} free{why}")

    def _make_room(self, short: Callable[[], int], cached_of: Sequence[str | None], victims: Sequence[KVFile]) -> None:
        """While ``short()`` pages are missing: reclaim the cached-only prefix pages of
        ``cached_of`` (``None``: anyone's), then spill ``victims`` in order, reclaiming after each."""
        for tenant in cached_of:
            self.prefix_cache.reclaim(short(), tenant)
        for victim in victims:
            if short() <= 0:
                return
            if victim.residency != DEVICE or not victim.pages:
                continue  # spilled by an earlier step of the same reserve
            self.spill(victim)
            for tenant in cached_of:
                self.prefix_cache.reclaim(short(), tenant)

    def victims(self, account: str) -> list[KVFile]:
        """Idle unpinned device files that may be spilled for ``account``, each group least
        recently used first. For an account within its fair share: first those of the active
        accounts above theirs, then everyone's (plain LRU, also when no other account is
        active). For an account above its share: only its own, then those of accounts with no
        live session; it never makes room by spilling an active account's files."""
        files = self.catalogue.evictable()
        if not self.shares.contended(account):
            return files
        active = self.accounts.active_weights()
        if self.shares.over_share(account):
            own = [f for f in files if self.accounts.of(f.tenant) == account]
            return own + [f for f in files if self.accounts.of(f.tenant) not in active]
        over = {a for a in active if a != account and self.shares.over_share(a)}
        first = [f for f in files if self.accounts.of(f.tenant) in over]
        return first + [f for f in files if self.accounts.of(f.tenant) not in over]

    def ensure_device(self, file: KVFile, moves: list[TierMove] | None = None) -> None:
        """Bring a spilled file back onto device pages. Its first full pages that the tenant's
        prefix cache holds (a system prompt every conversation starts with) are mapped, not
        copied: a reloaded conversation shares them again as it did before it left, so it takes
        only its own pages of the device and of the copy. (Reloaded onto fresh pages, 48
        conversations over one 600-token system prompt each came back with a private copy of
        its four pages: the device held half as many of them, and every reload copied twice
        the bytes.) The fresh pages are indexed as a new file's would be. ``moves``: see
        ``Tiers.reload``."""
        if file.residency == DEVICE:
            return
        lead = self.prefix_cache.cached_lead(file)
        try:
            self.reserve(file.tenant, file.spilled_pages - len(lead))
        except BaseException:
            self.alloc.decref(lead)
            raise
        self.tiers.reload(file, lead, moves)
        file.registered = len(lead)
        self.prefix_cache.register_full_pages(file)

    def swap_out(self, owner: Owner) -> int:
        """Move the session's private files to host memory while it waits; returns pages freed.

        A file sharing pages with a file that stays (a fork of a stored context, as every agent
        of a team holds) stays too: moving it frees only its own pages, and bringing it back
        allocates all of them, the shared ones as private copies, so N waiting forks of one
        context would come back as N copies of it (and fail with ENOSPC where the pages were
        budgeted shared). References of the prefix index do not count: a page only the index
        holds is reclaimable anyway."""
        files = [
            f
            for f in self.catalogue.session_files(owner)
            if f.residency == DEVICE
            and f.pages
            and not f.plan_pending
            and all(self.catalogue.handles.owner_of(hid) == owner for hid in f.handles)
        ]
        inside = Counter(p for f in files for p in f.pages)
        indexed = set(self.prefix_cache.pages())
        freed = 0
        for file in files:
            if any(self.alloc.refcount(p) > inside[p] + (p in indexed) for p in file.pages):
                continue
            before = self.alloc.free_count
            self.tiers.device_to_host(file)
            freed += self.alloc.free_count - before
        return freed
