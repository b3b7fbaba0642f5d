"""Quotas and account shares: what a session, a tenant and an account may hold.

Three kinds of bound meet here, each refused with its own error before any page moves:

* a **session's** cap on the device pages its open files hold (the run's ``max_pages``), ENOSPC;
* a **tenant's** plan shares (gpu_worker/kvfs/quota.py): named files it may have, pinned device
  pages (and the worker's cap on all tenants' pinned pages), EDQUOT or ENOSPC;
* an **account's** bounds on the device pool (gpu_worker/kvfs/accounts.py): its ceiling and,
  under contention, its fair share, which ``Placement`` enforces when it makes room;
* an **account's** bytes of named files in the KV store (``PoolName.KV_STORE_BYTES``): its
  tenants together within the plan's stored bytes and the store pool's ceiling, and everyone
  together within the store's capacity, ENOSPC. Files persist, so nothing is reclaimed from an
  account past a share: the ceiling is what keeps the reserve free for every other account.

It reads the catalogue and the allocator and changes neither; the ``KVFS`` facade holds its
lock around every call.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpu_worker.kvfs.accounts import Accounts, DeviceShares
from gpu_worker.kvfs.catalogue import Catalogue
from gpu_worker.kvfs.errors import KVQuotaExceeded, NoSpace
from gpu_worker.kvfs.files import KVFile, Owner
from gpu_worker.kvfs.pages import PageAllocator
from gpu_worker.kvfs.quota import TenantQuota, share_pages
from gpu_worker.resource_model import RESERVE_FRACTION, Pool, PoolName


@dataclass(frozen=True)
class KVFSLimits:
    """Per-tenant budgets; ``None`` means unlimited (bounded by the pool itself). The
    ``*_per_tenant`` / share fields are the defaults of tenants whose plan set none
    (:meth:`KVFS.set_tenant_quota`)."""

    device_pages_per_tenant: int | None = None
    stored_bytes_per_tenant: int | None = None
    max_handles_per_session: int = 1024
    pinned_device_share: float | None = None
    host_share: float | None = None
    max_files_per_tenant: int | None = None
    #: Of the device pool, what the pinned files of all tenants together may hold.
    max_pinned_fraction: float | None = None
    #: Of the device pool, what no one account may hold (``resource_model.Pool.reserve``).
    account_reserve_fraction: float = RESERVE_FRACTION
    #: Bytes the KV store may keep for named files, measured when the worker starts
    #: (``store_capacity``); ``None``: unmeasured (an object store), bounded by plans alone.
    store_bytes: int | None = None

    def default_quota(self) -> TenantQuota:
        return TenantQuota(
            stored_bytes=self.stored_bytes_per_tenant,
            pinned_device_share=self.pinned_device_share,
            host_share=self.host_share,
            max_files=self.max_files_per_tenant,
        )


class Budgets:
    """The bounds of sessions, tenants and accounts, and the checks that refuse past them."""

    def __init__(self, limits: KVFSLimits, alloc: PageAllocator, catalogue: Catalogue, page_bytes: int) -> None:
        self.limits = limits
        self.alloc = alloc
        self.catalogue = catalogue
        self.page_bytes = page_bytes
        self._session_limits: dict[Owner, int] = {}
        self._tenant_quotas: dict[str, TenantQuota] = {}
        #: Per-account bounds on the device pool (gpu_worker/kvfs/accounts.py).
        self.accounts = Accounts()
        self.shares = DeviceShares(alloc.usable, self.accounts, alloc.tenant_pages, limits.account_reserve_fraction)

    @property
    def store_pool(self) -> Pool | None:
        """The KV store's bytes as a pool (``None``: its capacity was not measured)."""
        if self.limits.store_bytes is None:
            return None
        return Pool(PoolName.KV_STORE_BYTES, self.limits.store_bytes)

    # -------------------------------------------------------------------- sessions
    def join(self, owner: Owner, max_pages: int | None, account: str | None, weight: float) -> None:
        """Count the session's tenant against ``account`` (active with ``weight``) and cap its
        pages at ``max_pages``, never above the pool's ceiling (``None``: the ceiling alone)."""
        self.accounts.join(owner, account, weight)
        if max_pages is None or max_pages >= self.shares.pool.ceiling:
            # The account's bound is this one too, and its refusal names the pool's bound.
            self._session_limits.pop(owner, None)
        else:
            self._session_limits[owner] = self.shares.pool.clamp(max_pages)

    def leave(self, owner: Owner) -> None:
        self._session_limits.pop(owner, None)
        self.accounts.leave(owner)

    def session_cap(self, owner: Owner) -> int | None:
        """The most device pages the session's open files may hold (``None``: no session cap)."""
        return self._session_limits.get(owner)

    def check_session(self, owner: Owner, adding: int) -> None:
        """ENOSPC when ``adding`` pages would take the session past its cap."""
        cap = self._session_limits.get(owner)
        if cap is None:
            return
        held = len(self.catalogue.held(owner)[0])
        if held + adding > cap:
            raise NoSpace(f"session KV page limit exceeded: {held} held + {adding} needed > {cap} pages")

    # --------------------------------------------------------------------- tenants
    def set_tenant_quota(self, tenant: str, quota: TenantQuota | None) -> None:
        if quota is None:
            self._tenant_quotas.pop(tenant, None)
        else:
            self._tenant_quotas[tenant] = quota

    def quota(self, tenant: str) -> TenantQuota:
        """The tenant's effective bounds: its plan's, each unset field from ``KVFSLimits``."""
        return self._tenant_quotas.get(tenant, TenantQuota()).or_default(self.limits.default_quota())

    def _account_tenants(self, tenant: str) -> list[str]:
        """The tenants whose named files count with ``tenant``'s: its account's (a person's
        tenants together, once each has had a session here), or itself alone."""
        return self.accounts.tenants(self.accounts.of(tenant)) if self.accounts.bounded(tenant) else [tenant]

    def check_file_count(self, tenant: str) -> None:
        """EDQUOT when the tenant may not have one more named file: the plan's count bounds its
        account's tenants together, as its stored bytes do."""
        cap = self.quota(tenant).max_files
        if cap is None:
            return
        tenants = self._account_tenants(tenant)
        have = sum(self.catalogue.file_count(t) for t in tenants)
        if have >= cap:
            whose = "the tenant has" if len(tenants) == 1 else f"the account's {len(tenants)} tenants have"
            raise KVQuotaExceeded(f"{whose} {have} named KV files (its plan allows {cap}); remove some first")

    def check_pinned(self, tenant: str, adding: int, what: str) -> None:
        """Refuse ``adding`` more pinned pages past the tenant's device share or the worker's
        cap on all pinned pages (EDQUOT)."""
        if adding <= 0:
            return
        quota = self.quota(tenant)
        cap = share_pages(quota.pinned_device_share, self.alloc.usable)
        held = self.catalogue.pinned_pages(tenant) if cap is not None else 0
        if cap is not None and held + adding > cap:
            raise KVQuotaExceeded(
                f"{what}: the tenant's pinned KV files would hold {held + adding} pages, past its plan's "
                f"share of the device pool ({quota.pinned_device_share:g} of {self.alloc.usable} = {cap} pages); "
                "unpin or remove a pinned file first"
            )
        fraction = self.limits.max_pinned_fraction
        worker_cap = share_pages(fraction, self.alloc.usable)
        everyone = self.catalogue.pinned_pages(None) if worker_cap is not None else 0
        if worker_cap is not None and everyone + adding > worker_cap:
            raise KVQuotaExceeded(
                f"{what}: the pinned KV files of all tenants on this worker would hold {everyone + adding} pages, "
                f"past the {fraction:g} of its {self.alloc.usable}-page device pool ({worker_cap} pages) they may "
                "hold; keep the file unpinned or retry later"
            )

    def check_growth(self, file: KVFile, grow: int) -> None:
        """A named file growing by ``grow`` pages: within its tenant's pinned share (when
        pinned) and stored-bytes budget."""
        if file.name is None:
            return
        if file.pinned:
            self.check_pinned(file.tenant, grow, f"cannot grow pinned KV file {file.name!r} by {grow} pages")
        self.check_stored(file.tenant, grow)

    def stored_fits(self, tenant: str, grow: int) -> bool:
        """Whether the tenant's named files may hold ``grow`` more pages (:meth:`check_stored`)."""
        try:
            self.check_stored(tenant, grow)
        except NoSpace:
            return False
        return True

    def check_stored(self, tenant: str, grow: int) -> None:
        """ENOSPC when ``grow`` more pages of the tenant's named files would take its account's
        stored bytes (all its tenants' named files, on any tier) past the plan's stored bytes or
        what one account may keep of the KV store, or the store past its capacity."""
        if grow <= 0:
            return
        tenants = self._account_tenants(tenant)
        stored = (sum(self.catalogue.stored_pages(t) for t in tenants) + grow) * self.page_bytes
        whose = "tenant's" if len(tenants) == 1 else f"account's ({len(tenants)} tenants together)"
        limit = self.quota(tenant).stored_bytes
        if limit is not None and stored > limit:
            raise NoSpace(
                f"stored KV budget exceeded: the {whose} named KV files would hold {stored} bytes, past the "
                f"plan's {limit}; remove some first"
            )
        pool = self.store_pool
        if pool is None:
            return
        if stored > pool.ceiling:
            raise NoSpace(
                f"stored KV budget exceeded: the {whose} named KV files would hold {stored} bytes, past what one "
                f"account may keep of this worker's KV store ({pool.ceiling} of {pool.capacity} bytes, the rest "
                "kept for others); remove some first"
            )
        everyone = (self.catalogue.stored_pages(None) + grow) * self.page_bytes
        if everyone > pool.capacity:
            # What the others keep is theirs to know: the refusal says nothing of it.
            raise NoSpace(
                f"the KV store is full: no room for {grow * self.page_bytes} more bytes of named KV files; "
                "retry later or remove files"
            )

    def host_share_pages(self, tenant: str, host_capacity: int) -> int | None:
        """The host pages the tenant's share allows (``None``: no bound)."""
        return share_pages(self.quota(tenant).host_share, host_capacity)
