"""The parts behind the KVFS facade, each driven alone over real pages, tiers and a real store.

``KVFS`` (gpu_worker/kvfs/fs.py) holds the lock and the file operations; these tests build one
part at a time (with only the parts it reads) to pin down what each answers or refuses.
"""

from __future__ import annotations

import threading

import pytest

from gpu_worker.kvfs import KVFSLimits, KVQuotaExceeded, LocalKVStore, NoSpace, NotFound, Owner, TenantQuota
from gpu_worker.kvfs.budgets import Budgets
from gpu_worker.kvfs.catalogue import Catalogue
from gpu_worker.kvfs.coherence import Coherence
from gpu_worker.kvfs.files import DEVICE, DISK, HOST, KVFile
from gpu_worker.kvfs.lease import Leases
from gpu_worker.kvfs.metering import Metering
from gpu_worker.kvfs.pages import PageAllocator
from gpu_worker.kvfs.placement import Placement
from gpu_worker.kvfs.prefix_cache import PrefixCache
from gpu_worker.kvfs.tiers import Tiers
from gpu_worker.kvfs.writeback import WriteBack
from tests.kvfs.memio import BLOCK, MemPageIO

A = Owner("acme", "s1")
A2 = Owner("acme", "s2")


def _device_file(alloc: PageAllocator, io: MemPageIO, tenant: str, name: str | None, tokens: list[int]) -> KVFile:
    """A computed file on freshly allocated pages, its KV written as a forward would."""
    n_pages = -(-len(tokens) // BLOCK)
    pages = alloc.alloc(tenant, n_pages)
    for pos, tok in enumerate(tokens):
        io.pages[pages[pos // BLOCK], :, pos % BLOCK, :] = float(tok * 1000 + pos)
    return KVFile(tenant=tenant, name=name, tokens=list(tokens), computed=len(tokens), pages=pages)


class Parts:
    """Every part over one allocator, tiers and store, wired as ``KVFS.__init__`` wires them."""

    def __init__(self, tmp_path, num_pages: int = 16, host_pages: int = 4, limits: KVFSLimits | None = None) -> None:
        self.io = MemPageIO(num_pages)
        self.store = LocalKVStore(tmp_path / "store")
        self.alloc = PageAllocator(num_pages)
        self.released: list[str] = []
        self.catalogue = Catalogue(max_handles_per_session=3)
        self.tiers = Tiers(
            self.alloc, self.io, self.store, host_pages, persist=lambda f: self.coherence.persist_closed(f)
        )
        self.coherence = Coherence(
            self.store, Leases(self.store, "w1"), self.catalogue, self.tiers, self.released.append
        )
        self.budgets = Budgets(limits or KVFSLimits(), self.alloc, self.catalogue, page_bytes=100)
        self.prefix = PrefixCache(self.alloc, BLOCK, enabled=True)
        self.placement = Placement(self.alloc, self.tiers, self.catalogue, self.budgets, self.prefix)
        self.writeback = WriteBack(threading.RLock(), self.store, self.coherence, self.catalogue, self.tiers)
        self.metering = Metering(
            self.alloc, self.tiers, self.catalogue, self.prefix, self.coherence.leased, page_bytes=100, block_size=BLOCK
        )

    def named(self, name: str, tokens: list[int], tenant: str = "acme") -> KVFile:
        file = _device_file(self.alloc, self.io, tenant, name, tokens)
        file.generation = self.coherence.acquire(tenant, name, create=True)
        file.changed()
        self.catalogue.named[(tenant, name)] = file
        return file


def test_catalogue_caps_handles_per_session_and_answers_per_tenant(tmp_path):
    parts = Parts(tmp_path)
    doc = parts.named("doc", list(range(10)))  # 3 pages
    doc.pinned = True
    parts.named("notes", list(range(4)))  # 1 page
    hids = [parts.catalogue.new_handle(A, doc) for _ in range(3)]
    with pytest.raises(NoSpace, match="too many open KV handles"):
        parts.catalogue.new_handle(A, doc)
    parts.catalogue.new_handle(A2, doc)  # the cap is per session
    assert parts.catalogue.session_files(A) == [doc]  # each file once
    assert parts.catalogue.held(A) == (set(doc.pages), 30)
    assert parts.catalogue.stored_pages("acme") == 4
    assert parts.catalogue.pinned_pages("acme") == 3
    assert parts.catalogue.pinned_pages(None) == 3
    assert parts.catalogue.file_count("acme") == 2
    # An open or pinned file is never a spill victim; the idle unpinned one is.
    assert [f.name for f in parts.catalogue.evictable()] == ["notes"]
    for hid in hids:
        parts.catalogue.handles.pop(hid)
    assert parts.catalogue.session_files(A) == []


def test_budgets_refuse_past_each_bound_with_its_own_error(tmp_path):
    parts = Parts(tmp_path, limits=KVFSLimits(max_pinned_fraction=0.5))
    parts.budgets.set_tenant_quota("acme", TenantQuota(stored_bytes=500, pinned_device_share=0.25, max_files=2))
    doc = parts.named("doc", list(range(12)))  # 3 pages, 300 bytes at 100 bytes a page
    parts.named("notes", [1])
    with pytest.raises(KVQuotaExceeded, match="2 named KV files"):
        parts.budgets.check_file_count("acme")
    parts.budgets.check_growth(doc, 1)  # 500 bytes: the budget exactly
    with pytest.raises(NoSpace, match="stored KV budget"):
        parts.budgets.check_growth(doc, 2)
    # 0.25 of the 15 usable pages is 3: pinning the 3-page file fits, a fourth page does not.
    parts.budgets.check_pinned("acme", 3, "pin doc")
    doc.pinned = True
    with pytest.raises(KVQuotaExceeded, match="share of the device pool"):
        parts.budgets.check_pinned("acme", 1, "grow doc")
    # A session capped at 4 pages holding doc's 3 may take one more, not two.
    parts.budgets.join(A, 4, account=None, weight=1.0)
    parts.catalogue.new_handle(A, doc)
    parts.budgets.check_session(A, 1)
    with pytest.raises(NoSpace, match="session KV page limit exceeded: 3 held \\+ 2 needed > 4"):
        parts.budgets.check_session(A, 2)
    parts.budgets.leave(A)
    assert parts.budgets.session_cap(A) is None
    assert parts.budgets.quota("bravo") == KVFSLimits(max_pinned_fraction=0.5).default_quota()


def test_coherence_reloads_a_copy_another_worker_wrote(tmp_path):
    parts = Parts(tmp_path)
    doc = parts.named("doc", list(range(8)))
    parts.coherence.persist_closed(doc)  # generation 1 in the store, lease given back
    doc.stored, doc.dirty = True, False
    assert parts.coherence.leased == {}
    assert parts.coherence.lookup("acme", "doc") is doc  # still the store's generation
    other = Leases(parts.store, "w2")  # another worker takes the lease and writes generation 2
    other.acquire("acme", "doc")
    other.bump("acme", "doc")
    other.release("acme", "doc")
    fresh = parts.coherence.lookup("acme", "doc")
    assert fresh is not doc and fresh.residency == DISK and fresh.tokens == list(range(8))
    assert parts.released == [doc.seq_id]  # the engine forgets the stale copy
    parts.coherence.unlink(fresh)
    with pytest.raises(NotFound):
        parts.coherence.lookup("acme", "doc")
    assert parts.store.list("acme/") == []


def test_prefix_cache_maps_only_whole_cached_pages(tmp_path):
    parts = Parts(tmp_path)
    tokens = list(range(1, 11))  # 2 full pages and a partial one
    file = _device_file(parts.alloc, parts.io, "acme", None, tokens)
    parts.prefix.register_full_pages(file)
    assert parts.prefix.indexed() == 2 and file.registered == 2
    pages, keys = parts.prefix.match("acme", [*tokens, 99], limit=100)
    assert pages == file.pages[:2] and keys == file.chain[:2]
    assert parts.prefix.match("acme", tokens[:8], limit=100)[0] == file.pages[:1]  # never the last token
    assert parts.prefix.match("bravo", tokens, limit=100) == ([], [])  # tenant-scoped
    assert parts.prefix.cached_only() == 0  # the file still uses them
    parts.alloc.decref(file.pages)
    assert parts.prefix.cached_only() == 2
    assert parts.prefix.reclaim(5) == 2 and parts.alloc.free_count == parts.alloc.usable
    off = PrefixCache(parts.alloc, BLOCK, enabled=False)
    off.register_full_pages(file)
    assert off.match("acme", tokens, limit=100) == ([], []) and off.reclaim(3) == 0


def test_placement_spills_least_recently_used_idle_files_to_make_room(tmp_path):
    parts = Parts(tmp_path, num_pages=9, host_pages=2)  # 8 usable pages, 2 on host
    old = parts.named("old", list(range(8)))  # 2 pages
    mid = parts.named("mid", list(range(8)))
    new = parts.named("new", list(range(8)))
    for f in (old, mid, new):
        f.touch()
    parts.catalogue.new_handle(A, mid)  # open: never spilled
    parts.placement.reserve("acme", 4)  # 2 free; needs old's 2 pages
    assert (old.residency, mid.residency, new.residency) == (HOST, DEVICE, DEVICE)
    assert parts.alloc.free_count == 4
    parts.alloc.alloc("acme", 4)
    parts.placement.reserve("acme", 2)  # host is full with old: old goes to disk, new to host
    assert (old.residency, new.residency) == (DISK, HOST)
    with pytest.raises(NoSpace, match="KV cache full"):
        parts.placement.reserve("acme", 3)  # only mid's pages are left, and mid is open


def test_writeback_writes_a_closed_file_once_and_skips_a_stale_snapshot(tmp_path):
    parts = Parts(tmp_path)
    doc = parts.named("doc", list(range(8)))
    flush = parts.writeback.begin(doc)
    assert flush is not None and flush.generation == 1
    doc.changed()  # changed after the snapshot: the write lands, but the file stays dirty
    parts.writeback.write([flush])
    assert doc.dirty and ("acme", "doc") in parts.coherence.leased
    again = parts.writeback.begin(doc)
    assert again is not None
    parts.writeback.write([again])
    assert not doc.dirty and doc.stored and parts.coherence.leased == {}
    assert parts.coherence.leases.read("acme", "doc").generation == 2
    lazy = parts.named("chat", [1, 2, 3])
    lazy.durable = False
    assert parts.writeback.due(now=lazy.last_used + 10, idle_s=60, limit=4) == []
    (due,) = parts.writeback.due(now=lazy.last_used + 60, idle_s=60, limit=4)
    assert due.file is lazy


def test_metering_counts_a_sessions_distinct_pages_and_lists_leases(tmp_path):
    parts = Parts(tmp_path)
    doc = parts.named("doc", list(range(6)))  # 2 pages
    parts.catalogue.new_handle(A, doc)
    parts.catalogue.new_handle(A, doc)  # the same pages twice count once
    ((event, pages),) = parts.metering.live_usage([A])
    assert pages == 2 and event == {"run_pages": 2, "tenant_device_pages": 2, "tenant_host_pages": 0, "tokens": 12}
    (row,) = parts.metering.list_files("acme")
    assert (row.name, row.tokens, row.bytes, row.leased) == ("doc", 6, 200, True)
    stats = parts.metering.stats()
    assert (stats.files, stats.open_handles, stats.used_pages) == (1, 2, 2)
    parts.metering.check()


def test_stored_bytes_count_per_account_and_within_the_store_pool(tmp_path):
    """The plan's stored bytes bound an account's tenants together (two tenants of one person do
    not get twice the budget), no account may keep more than the store pool's ceiling, and all
    accounts together stop at the store's capacity (``PoolName.KV_STORE_BYTES``)."""
    parts = Parts(tmp_path, num_pages=32, limits=KVFSLimits(store_bytes=2000))  # ceiling 1500 (a quarter kept)
    for tenant in ("acme", "acme-2"):
        parts.budgets.set_tenant_quota(tenant, TenantQuota(stored_bytes=800))
    parts.budgets.join(A, None, account="u1", weight=1.0)
    parts.budgets.join(Owner("acme-2", "s9"), None, account="u1", weight=1.0)
    parts.named("doc", list(range(16)))  # 4 pages: 400 bytes of acme
    second = parts.named("doc", list(range(12)), tenant="acme-2")  # 3 pages: 300 bytes of acme-2
    parts.budgets.check_growth(second, 1)  # 800 bytes across the account: the budget exactly
    with pytest.raises(NoSpace, match=r"account's \(2 tenants together\).*past the plan's 800"):
        parts.budgets.check_growth(second, 2)

    # A richer plan still stops at what one account may keep of the store.
    parts.budgets.set_tenant_quota("acme-2", TenantQuota(stored_bytes=10_000))
    parts.budgets.check_growth(second, 8)  # 1500 bytes: the ceiling exactly
    with pytest.raises(NoSpace, match="one account may keep of this worker's KV store"):
        parts.budgets.check_growth(second, 9)

    # Another account's files leave the reserve to the rest; the store itself is the last bound.
    parts.budgets.set_tenant_quota("other", TenantQuota(stored_bytes=10_000))
    parts.budgets.join(Owner("other", "s5"), None, account="u2", weight=1.0)
    theirs = parts.named("big", list(range(48)), tenant="other")  # 12 pages: 1200 bytes
    assert not parts.budgets.stored_fits("acme-2", 2)  # 700 + 1200 + 200 > 2000
    with pytest.raises(NoSpace, match="the KV store is full") as full:
        parts.budgets.check_growth(theirs, 2)
    assert "2000" not in str(full.value) and "2100" not in str(full.value)  # nothing of what others keep
    parts.budgets.check_growth(theirs, 1)


def test_the_plans_file_count_bounds_an_accounts_tenants_together(tmp_path):
    """Two tenants of one person share the plan's ``max_kv_files``; another person's tenant has
    its own."""
    parts = Parts(tmp_path)
    for tenant in ("acme", "acme-2", "other"):
        parts.budgets.set_tenant_quota(tenant, TenantQuota(max_files=3))
    parts.budgets.join(A, None, account="u1", weight=1.0)
    parts.budgets.join(Owner("acme-2", "s9"), None, account="u1", weight=1.0)
    parts.budgets.join(Owner("other", "s5"), None, account="u2", weight=1.0)
    parts.named("a", [1])
    parts.named("b", [2])
    parts.named("c", [3], tenant="acme-2")
    with pytest.raises(KVQuotaExceeded, match="the account's 2 tenants have 3 named KV files"):
        parts.budgets.check_file_count("acme-2")
    with pytest.raises(KVQuotaExceeded):
        parts.budgets.check_file_count("acme")
    parts.named("d", [4], tenant="other")
    parts.budgets.check_file_count("other")
