"""Metering and views: what KVFS holds, for the worker's tick, the admin API and tests.

Read-only: per-session page counts (what page-seconds are metered on) and the fields of each
run's live ``kv`` event, the pool and tier totals (``KVStats``), the rows of ``kv_list``
(``KVFileInfo``), and the global invariants :meth:`Metering.check` asserts (refcounts equal
the references of live files and the prefix index; host counts equal the host tensors held).
It takes no lock: the ``KVFS`` facade holds its lock around every call.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from gpu_worker.kvfs.catalogue import Catalogue
from gpu_worker.kvfs.files import DEVICE, DISK, Owner, pages_for
from gpu_worker.kvfs.pages import PageAllocator
from gpu_worker.kvfs.placement import host_pages_of
from gpu_worker.kvfs.prefix_cache import PrefixCache
from gpu_worker.kvfs.stats import KVFileInfo, KVStats
from gpu_worker.kvfs.tiers import Tiers


class Metering:
    """Usage, totals and listings of the pool, the tiers and the files."""

    def __init__(
        self,
        alloc: PageAllocator,
        tiers: Tiers,
        catalogue: Catalogue,
        prefix_cache: PrefixCache,
        leased: dict[tuple[str, str], float],
        page_bytes: int,
        block_size: int,
    ) -> None:
        """``leased``: the write leases this worker holds (``Coherence.leased``), shown in listings."""
        self.alloc = alloc
        self.tiers = tiers
        self.catalogue = catalogue
        self.prefix_cache = prefix_cache
        self.leased = leased
        self.page_bytes = page_bytes
        self.block_size = block_size

    def stats(self) -> KVStats:
        files = list(self.catalogue.named.values())
        return KVStats(
            total_pages=self.alloc.usable,
            free_pages=self.alloc.free_count,
            used_pages=self.alloc.usable - self.alloc.free_count,
            pages_per_tenant=self.alloc.per_tenant(),
            host_pages=self.tiers.host_used,
            host_clean_pages=self.tiers.clean_pages,
            host_capacity_pages=self.tiers.host_capacity,
            disk_pages=sum(f.spilled_pages for f in files if f.residency == DISK),
            prefix_cached_pages=self.prefix_cache.cached_only(),
            prefix_indexed_pages=self.prefix_cache.indexed(),
            files=len(files),
            open_handles=len(self.catalogue.handles),
        )

    def session_usage(self, owner: Owner) -> int:
        """Distinct device pages held by the session's open files now."""
        return len(self.catalogue.held(owner)[0])

    def live_usage(self, owners: Sequence[Owner]) -> list[tuple[dict[str, int], float]]:
        """Per session: the fields of its live ``kv`` event and its proportional share of the
        distinct device pages it holds, what page-seconds are metered on: a page that ``n`` of
        ``owners`` hold counts ``1/n`` to each (as proportional set size does), so runs sharing a
        context pay for it once between them, in equal parts, whoever opened it first (the tick
        passes every live session). The event tells a run only about itself and
        its own tenant: the pages it holds, its tenant's device and host pages, its tokens.
        Worker-wide totals would show every other tenant's prompt sizes as they come and go;
        staff read those from /api/v1/admin/workers and /metrics. One call for every live
        session, so the worker's tick takes the lock once, not twice per session."""
        host = self.host_pages_per_tenant()
        held = [self.catalogue.held(owner) for owner in owners]
        holders = Counter(page for pages, _tokens in held for page in pages)
        out = []
        for owner, (pages, tokens) in zip(owners, held, strict=True):
            event = {
                "run_pages": len(pages),
                "tenant_device_pages": self.alloc.tenant_pages(owner.tenant),
                "tenant_host_pages": host.get(owner.tenant, 0),
                "tokens": tokens,
            }
            out.append((event, sum(1 / holders[page] for page in pages)))
        return out

    def host_pages_per_tenant(self) -> Counter[str]:
        """Host-memory pages per tenant: spilled and swapped files, and clean copies."""
        held: Counter[str] = Counter()
        for f in self.catalogue.live_files():
            held[f.tenant] += host_pages_of(f)
        return held

    def list_files(self, tenant: str | None = None) -> list[KVFileInfo]:
        rows = [
            KVFileInfo(
                tenant=f.tenant,
                name=f.name or "",
                tokens=len(f.tokens),
                bytes=f.n_pages * self.page_bytes,
                residency=f.residency,
                pinned=f.pinned,
                last_used=f.last_used,
                generation=f.generation,
                leased=(t, f.name or "") in self.leased,
            )
            for (t, _), f in self.catalogue.named.items()
            if tenant is None or t == tenant
        ]
        return sorted(rows, key=lambda r: (r.tenant, r.name))

    def check(self) -> None:
        """Assert global invariants: refcounts equal references from live files, no leaks."""
        self.alloc.check()
        live: set[int] = set()
        refs: Counter[int] = Counter()
        files = self.catalogue.live_files()
        for f in files:
            if f.residency == DEVICE:
                assert len(f.pages) == pages_for(f.computed, self.block_size), f.path
                refs.update(f.pages)
                live.update(f.pages)
            assert all(self.alloc.owner(p) == f.tenant for p in f.pages)
        refs.update(self.prefix_cache.pages())
        held_on_host = sum(f.host_data.shape[0] for f in files if f.host_data is not None)
        assert self.tiers.host_used == held_on_host, (self.tiers.host_used, held_on_host)
        clean = sum(f.host_data.shape[0] for f in files if f.host_data is not None and self.tiers.has_clean_copy(f))
        assert self.tiers.clean_pages == clean, (self.tiers.clean_pages, clean)
        for p in range(1, self.alloc.num_pages):
            # Pages reserved by in-flight plans are the only references not held by a file.
            assert self.alloc.refcount(p) >= refs[p], p
        if not any(f.plan_pending for f in files):
            for p in range(1, self.alloc.num_pages):
                assert self.alloc.refcount(p) == refs[p], (p, self.alloc.refcount(p), refs[p])
