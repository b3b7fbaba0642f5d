"""The KVFS facade: KV files as the session server and scheduler see them.

All bookkeeping happens under one lock; page contents move only through ``PageIO`` (the
engine). The facade holds the lock and the file operations (create, open, fork, append,
truncate, close...); each concern behind them is a small part it calls with the lock held:
``Catalogue`` (handles and names), ``Coherence`` (store and leases), ``Budgets`` (session caps,
tenant quotas, account shares), ``Placement`` (spill, reload, tier policy), ``PrefixCache``,
``WriteBack`` (write-through and lazy writes) and ``Metering`` (usage, listings, invariants).

Named files are shared with every worker using the same store: a write lease with a
generation number (gpu_worker/kvfs/lease.py) gives each one writer at a time, and a cached copy
is checked against the store's generation whenever it is opened, so no worker serves a stale
copy or flushes one over a newer write (gpu_worker/kvfs/coherence.py).

Appends are two-phase: ``plan_append`` reserves pages and says what the forward must compute,
``commit_append`` makes it visible, ``abort_append`` gives everything back, so a failed forward
loses nothing.
"""

from __future__ import annotations

import functools
import logging
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gpu_worker.kvfs.budgets import Budgets, KVFSLimits
from gpu_worker.kvfs.catalogue import Catalogue
from gpu_worker.kvfs.coherence import Coherence, held_here
from gpu_worker.kvfs.errors import Busy, Exists, InvalidArgument, NotFound
from gpu_worker.kvfs.files import (
    DISK,
    Handle,
    KVFile,
    Owner,
    pages_for,
    validate_name,
    validate_tenant,
)
from gpu_worker.kvfs.lease import DEFAULT_LEASE_TTL_S, Leases
from gpu_worker.kvfs.metering import Metering
from gpu_worker.kvfs.pages import PageAllocator
from gpu_worker.kvfs.placement import Placement
from gpu_worker.kvfs.prefix import PrefixIndex
from gpu_worker.kvfs.prefix_cache import PrefixCache
from gpu_worker.kvfs.quota import TenantQuota
from gpu_worker.kvfs.stats import KVFileInfo, KVStats
from gpu_worker.kvfs.store import KVStore
from gpu_worker.kvfs.tiers import PageIO, TierMove, Tiers
from gpu_worker.kvfs.writeback import Flush, WriteBack

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])
#: Seconds a closed ``durable=False`` file keeps unwritten changes before :meth:`KVFS.write_idle`
#: writes it: longer than the pause between two turns of a conversation, whose next turn would
#: otherwise find each turn's close writing its whole file (tens of MB) through to the store.
DEFAULT_LAZY_WRITE_S = 120.0


def _locked(method: F) -> F:
    @functools.wraps(method)
    def wrapper(self: KVFS, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


@dataclass(eq=False)
class AppendPlan:
    """What one append must run through the engine; turned into a ``SeqWork`` by the scheduler.

    ``run_token_ids`` = pending tokens + new tokens, at positions starting at
    ``num_computed_tokens``; the caller's logits rows are shifted by ``n_pending``.
    """

    seq_id: str
    num_computed_tokens: int
    page_ids: tuple[int, ...]
    page_copies: tuple[tuple[int, int], ...]
    run_token_ids: tuple[int, ...]
    n_pending: int
    _file: KVFile = field(repr=False)
    _new_tokens: tuple[int, ...] = field(repr=False)
    _allocated: tuple[int, ...] = field(repr=False)
    _replaced: tuple[int, ...] = field(repr=False)
    _done: bool = field(default=False, repr=False)


class KVFS:
    """KV files over a fixed pool of engine pages, with host and disk tiers."""

    def __init__(
        self,
        num_pages: int,
        block_size: int,
        page_bytes: int,
        page_io: PageIO,
        store: KVStore,
        host_pages: int = 0,
        limits: KVFSLimits | None = None,
        on_release: Callable[[str], None] | None = None,
        worker_id: str | None = None,
        lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
        prefix_cache: bool = False,
        lazy_write_s: float = DEFAULT_LAZY_WRITE_S,
    ) -> None:
        """``on_release(seq_id)`` is called when no handle uses a file any more (pass ``Engine.release``).
        ``worker_id`` names this worker in the write leases of the shared store (default: unique
        to the process). ``prefix_cache`` turns on the tenant-scoped automatic prefix cache
        (gpu_worker/kvfs/prefix.py; the worker turns it on, unit tests of other parts leave it off
        so that a closed file frees its pages at once). ``lazy_write_s``: how long a closed
        ``durable=False`` file with unwritten changes stays unwritten (:meth:`write_idle`)."""
        self.block_size = block_size
        self.lazy_write_s = lazy_write_s
        self.page_bytes = page_bytes
        limits = limits or KVFSLimits()
        self.alloc = PageAllocator(num_pages)
        #: The tenant-scoped prefix index and what files do with it (gpu_worker/kvfs/prefix_cache.py).
        self.prefix_cache = PrefixCache(self.alloc, block_size, prefix_cache)
        self.prefix: PrefixIndex | None = self.prefix_cache.index
        self.tiers = Tiers(self.alloc, page_io, store, host_pages, persist=self._persist_closed)
        self.leases = Leases(store, worker_id, lease_ttl_s)
        self.page_io = page_io
        self.store = store
        #: Named files and open handles (gpu_worker/kvfs/catalogue.py); ``_named`` and
        #: ``_handles`` are its two tables.
        self.catalogue = Catalogue(limits.max_handles_per_session)
        self._handles = self.catalogue.handles
        self._named = self.catalogue.named
        self._lock = threading.RLock()
        self._on_release = on_release
        #: Session caps, tenant quotas and account shares (gpu_worker/kvfs/budgets.py).
        self.budgets = Budgets(limits, self.alloc, self.catalogue, page_bytes)
        #: Named files at their latest store generation, and the write leases held here
        #: (gpu_worker/kvfs/coherence.py).
        self.coherence = Coherence(store, self.leases, self.catalogue, self.tiers, self._release_seq)
        #: Spill, reload and tier policy (gpu_worker/kvfs/placement.py).
        self.placement = Placement(self.alloc, self.tiers, self.catalogue, self.budgets, self.prefix_cache)
        #: Write-through of closed named files, now or once idle (gpu_worker/kvfs/writeback.py).
        self.writeback = WriteBack(self._lock, store, self.coherence, self.catalogue, self.tiers)
        #: Usage, totals, listings and invariants (gpu_worker/kvfs/metering.py).
        self.metering = Metering(
            self.alloc, self.tiers, self.catalogue, self.prefix_cache, self.coherence.leased, page_bytes, block_size
        )
        self.accounts = self.budgets.accounts
        self.shares = self.budgets.shares

    @property
    def limits(self) -> KVFSLimits:
        return self.budgets.limits

    @limits.setter
    def limits(self, limits: KVFSLimits) -> None:
        """Limits set after construction bound every later request (the pool's account
        reserve excepted: it is sized once, with the pool)."""
        self.budgets.limits = limits
        self.catalogue.max_handles_per_session = limits.max_handles_per_session

    # ----------------------------------------------------------------- handles and files
    def _new_handle(self, owner: Owner, file: KVFile) -> int:
        return self.catalogue.new_handle(owner, file)

    def _get(self, owner: Owner, h: object) -> Handle:
        handle = self._handles.get(owner, h)
        self._ensure_device(handle.file)
        return handle

    def _persist_closed(self, file: KVFile) -> None:
        """Flush a file no handle writes any more and give its lease back (the tiers' ``persist``)."""
        self.coherence.persist_closed(file)

    def _release_seq(self, seq_id: str) -> None:
        if self._on_release is not None:
            self._on_release(seq_id)

    def _share(self, src: KVFile, n_tokens: int) -> KVFile:
        """A new anonymous file with ``src``'s first ``n_tokens``, sharing their pages (COW)."""
        computed = min(src.computed, n_tokens)
        pages = src.pages[: pages_for(computed, self.block_size)]
        self.alloc.incref(src.tenant, pages)
        full = computed // self.block_size
        return KVFile(
            tenant=src.tenant,
            tokens=src.tokens[:n_tokens],
            computed=computed,
            pages=list(pages),
            cache=src.cache,
            chain=src.chain[:full],
            registered=min(src.registered, full),
        )

    def _maybe_free(self, file: KVFile) -> None:
        """Anonymous (or unlinked) files die with their last handle; the engine forgets idle files."""
        if file.handles or file.plan_pending:
            return
        self._release_seq(file.seq_id)
        if file.name is None:
            self.tiers.drop(file)

    @_locked
    def create(self, owner: Owner, name: str | None = None, cache: bool = True, durable: bool = True) -> int:
        """A new empty file; named files are persistent and opened for writing. ``cache=False``
        keeps the file (and its forks) out of the prefix cache: its first append maps no cached
        prefix and its pages are never indexed. ``durable=False``: a cache of something the
        program can recompute (a conversation's KV), not written through at every close
        (:meth:`write_idle`); an anonymous file is never written either way."""
        file = KVFile(tenant=validate_tenant(owner.tenant), cache=bool(cache), durable=bool(durable))
        if name is not None:
            key = (owner.tenant, validate_name(name))
            try:
                self.coherence.lookup(owner.tenant, name)
            except NotFound:
                pass
            else:
                raise Exists(f"KV file {name!r} already exists")
            self.budgets.check_file_count(owner.tenant)
            file.generation = self.coherence.acquire(owner.tenant, name, create=True)
            file.name = name
            file.changed()  # written at its last close, so every worker sharing the store sees it
            self._named[key] = file
        hid = self._new_handle(owner, file)
        if name is not None:
            file.writer = hid
        log.info("event=kv_create tenant=%s session=%s file=%s", owner.tenant, owner.session, file.path)
        return hid

    @_locked
    def open(self, owner: Owner, name: str, mode: str = "r", moves: list[TierMove] | None = None) -> int:
        """Open a named file of the owner's tenant, reloading it from host or disk.

        ``"w"`` gives the exclusive writer handle to the file itself; ``"r"`` gives a private
        copy-on-write fork, so a reader's appends never change the stored file. ``moves``,
        when given, gets what the open brought back to the device (for the session's trace).
        """
        if mode not in ("r", "w"):
            raise InvalidArgument("mode must be 'r' or 'w'")
        file = self.coherence.lookup(owner.tenant, name)
        if mode == "w" and file.writer is not None:
            raise Busy(f"KV file {name!r} is already open for writing")
        if mode == "w":
            generation = self.coherence.acquire(owner.tenant, name)
            if generation != file.generation:  # another worker flushed since the check above
                self.coherence.forget(file)
                reloaded = self.coherence.load_from_store(owner.tenant, name)
                if reloaded is None:
                    self.coherence.release(KVFile(tenant=owner.tenant, name=name))
                    raise NotFound(f"no KV file named {name!r}")
                file = reloaded
        self.placement.ensure_device(file, moves)
        file.touch()
        if mode == "w":
            hid = self._new_handle(owner, file)
            file.writer = hid
            return hid
        return self._new_handle(owner, self._share(file, len(file.tokens)))

    @_locked
    def fork(self, owner: Owner, h: int) -> int:
        """O(pages) copy-on-write copy of a file: every page is shared until written."""
        src = self._get(owner, h).file
        return self._new_handle(owner, self._share(src, len(src.tokens)))

    def close(self, owner: Owner, h: int) -> None:
        with self._lock:
            flush = self._close(owner, h)
        self._write_through([flush] if flush is not None else [])

    def _close(self, owner: Owner, h: int) -> Flush | None:
        """Close a handle (lock held); a named file whose last handle this was and that changed
        comes back as a :class:`Flush` for the caller to write once the lock is released."""
        handle = self._handles.get(owner, h)
        self._handles.pop(handle.hid)
        file = handle.file
        if file.writer == handle.hid:
            file.writer = None
        file.touch()
        flush = None
        if file.persistent and not file.handles:
            if file.dirty and file.residency != DISK:
                if file.durable:
                    flush = self.writeback.begin(file)
                # else: written by write_idle, a spill to disk or flush; the lease stays held
            elif not file.dirty:
                self.coherence.release(file)
        self._maybe_free(file)
        return flush

    def _write_through(self, flushes: Sequence[Flush]) -> None:
        self.writeback.write(flushes)

    def write_idle(self, now: float | None = None, limit: int = 4) -> int:
        """Write through the closed ``durable=False`` files whose changes have waited
        ``lazy_write_s`` since their last close, at most ``limit`` of them (the longest idle
        first), and give their leases back (called from the worker's tick, which must not stall
        behind many writes). Until then a conversation's next turn finds its KV where the last
        one left it and no turn pays for writing tens of MB to the store; once written, a worker
        crash loses nothing of it and another worker may take its lease. Returns files written."""
        now = time.time() if now is None else now
        with self._lock:
            written = self.writeback.due(now, self.lazy_write_s, limit)
        self.writeback.write(written)
        return len(written)

    @_locked
    def set_session_limit(
        self, owner: Owner, max_pages: int | None, *, account: str | None = None, weight: float = 1.0
    ) -> None:
        """Open a session's account of the device pool: cap the pages its open files may hold
        (the run's ``max_pages``, never above the pool's ceiling; ``None``: the ceiling alone
        bounds it, through its account), count its tenant against ``account`` (``None``: the
        tenant alone) and make that account active, with ``weight``, until :meth:`close_session`."""
        self.budgets.join(owner, max_pages, account, weight)

    @_locked
    def set_tenant_quota(self, tenant: str, quota: TenantQuota | None) -> None:
        """The tenant's plan shares of each tier (``gpu_worker/kvfs/quota.py``); its unset fields
        (and ``None``: all of them) fall back to ``KVFSLimits``. The control plane sends it with
        each session and each pin, so it is known before the tenant can store or pin anything.
        Files already past a lowered share stay; only growth and new pins are refused."""
        self.budgets.set_tenant_quota(tenant, quota)

    def quota(self, tenant: str) -> TenantQuota:
        """The tenant's effective bounds (lock held or not needed: reads one dict entry)."""
        return self.budgets.quota(tenant)

    def _pinned_pages(self, tenant: str | None) -> int:
        return self.catalogue.pinned_pages(tenant)

    def close_session(self, owner: Owner) -> None:
        with self._lock:
            flushes = [self._close(owner, handle.hid) for handle in self._handles.of_session(owner)]
            self.budgets.leave(owner)
        self._write_through([f for f in flushes if f is not None])

    @_locked
    def remove(self, tenant: str, name: str) -> None:
        """Unlink a named file; open handles keep it alive as an anonymous file."""
        file = self.coherence.lookup(tenant, name)
        self._unlink(file)

    def _unlink(self, file: KVFile) -> None:
        self.coherence.unlink(file)
        self._maybe_free(file)

    delete = remove

    @_locked
    def remove_tenant(self, tenant: str) -> list[str]:
        """Unlink every named file of ``tenant`` and delete everything it has in the store,
        catalogued here or not: a store shared with other workers (S3) may hold files this worker
        never listed, written by one that is gone. Returns the names removed, sorted. Open
        handles keep their pages as anonymous files, as with :meth:`remove`."""
        validate_tenant(tenant)
        self.prefix_cache.drop_tenant(tenant)
        names = {name for (owner, name) in self._named if owner == tenant}
        for name in names:
            self._unlink(self._named[(tenant, name)])
        names |= self.coherence.delete_tenant(tenant)
        log.info("event=kv_remove_tenant tenant=%s files=%d", tenant, len(names))
        return sorted(names)

    @_locked
    def length(self, owner: Owner, h: int) -> int:
        return len(self._handles.get(owner, h).file.tokens)

    @_locked
    def tokens(self, owner: Owner, h: int) -> list[int]:
        return list(self._handles.get(owner, h).file.tokens)

    @_locked
    def truncate(self, owner: Owner, h: int, n: int) -> None:
        """Roll back to the first ``n`` tokens; whole pages beyond them are freed."""
        file = self._get(owner, h).file
        if not isinstance(n, int) or not 0 <= n <= len(file.tokens):
            raise InvalidArgument(f"truncate length must be in 0..{len(file.tokens)}")
        if file.plan_pending:
            raise Busy("KV file has an append in flight")
        self.tiers.forget_clean_copy(file)
        del file.tokens[n:]
        file.computed = min(file.computed, n)
        # Keys of pages no longer full go; the index keeps its entries (their keys cover the
        # tokens they were computed from, so they stay right) and its references make the next
        # append into a now-partial indexed page copy it first.
        del file.chain[file.computed // self.block_size :]
        file.registered = min(file.registered, len(file.chain))
        file.changed()
        keep = pages_for(file.computed, self.block_size)
        self.alloc.decref(file.pages[keep:])
        del file.pages[keep:]
        file.touch()

    @_locked
    def extract(self, owner: Owner, h: int, start: int, end: int) -> int:
        """A new file holding tokens ``start..end``; pages are shared only when positions match."""
        src = self._get(owner, h).file
        if not (isinstance(start, int) and isinstance(end, int) and 0 <= start <= end <= len(src.tokens)):
            raise InvalidArgument(f"extract range must satisfy 0 <= start <= end <= {len(src.tokens)}")
        if start == 0:
            return self._new_handle(owner, self._share(src, end))
        file = KVFile(tenant=src.tenant, tokens=src.tokens[start:end], cache=src.cache)
        return self._new_handle(owner, file)

    @_locked
    def merge(self, owner: Owner, a: int, b: int) -> int:
        """A new file ``a + b``; ``b``'s tokens land at shifted positions, so they are pending."""
        fa = self._get(owner, a).file
        fb = self._get(owner, b).file
        if not fa.tokens:
            return self._new_handle(owner, self._share(fb, len(fb.tokens)))
        file = self._share(fa, len(fa.tokens))
        file.tokens.extend(fb.tokens)
        return self._new_handle(owner, file)

    @_locked
    def pin(self, tenant: str, name: str, pinned: bool) -> None:
        """Pin (never spilled by policy) or unpin a named file; a pin that would take the
        tenant's pinned pages past its device share fails with EDQUOT and changes nothing."""
        file = self.coherence.lookup(tenant, name)
        if pinned and not file.pinned:
            self.budgets.check_pinned(tenant, file.n_pages, f"cannot pin KV file {name!r} ({file.n_pages} pages)")
        if file.pinned == bool(pinned):
            return
        file.pinned = bool(pinned)
        if not held_here(file):
            # The pin is part of the stored file, so a worker loading it later keeps it on device
            # too: written now as a new generation, under the lease like any write.
            self.coherence.acquire(tenant, name)
            self._persist_closed(file)

    # ----------------------------------------------------------------------- appends
    @_locked
    def plan_append(self, owner: Owner, h: int, token_ids: Sequence[int]) -> AppendPlan:
        file = self._get(owner, h).file
        new = tuple(token_ids)
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in new):
            raise InvalidArgument("token ids must be non-negative integers")
        if file.plan_pending:
            raise Busy("KV file has an append in flight")
        pending = file.tokens[file.computed :]
        if not new and not pending:
            raise InvalidArgument("nothing to append")
        bs = self.block_size
        total = len(file.tokens) + len(new)
        grow = pages_for(total, bs) - len(file.pages)
        cow = file.computed % bs != 0 and self.alloc.refcount(file.pages[-1]) > 1
        n_alloc = grow + (1 if cow else 0)
        self.budgets.check_growth(file, grow)
        self.budgets.check_session(owner, n_alloc)
        self._reserve(file.tenant, n_alloc)
        self.tiers.forget_clean_copy(file)  # the forward writes into the file's pages
        allocated = self.alloc.alloc(file.tenant, n_alloc)
        table = list(file.pages)
        copies: tuple[tuple[int, int], ...] = ()
        replaced: tuple[int, ...] = ()
        fresh = list(allocated)
        if cow:
            dst = fresh.pop(0)
            copies = ((table[-1], dst),)
            replaced = (table[-1],)
            table[-1] = dst
        table.extend(fresh)
        file.plan_pending = True
        return AppendPlan(
            seq_id=file.seq_id,
            num_computed_tokens=file.computed,
            page_ids=tuple(table),
            page_copies=copies,
            run_token_ids=tuple(pending) + new,
            n_pending=len(pending),
            _file=file,
            _new_tokens=new,
            _allocated=tuple(allocated),
            _replaced=replaced,
        )

    def _finish(self, plan: AppendPlan) -> KVFile:
        if plan._done:
            raise InvalidArgument("append plan already committed or aborted")
        plan._done = True
        plan._file.plan_pending = False
        return plan._file

    @_locked
    def commit_append(self, plan: AppendPlan) -> None:
        file = self._finish(plan)
        file.tokens.extend(plan._new_tokens)
        file.computed = len(file.tokens)
        file.pages = list(plan.page_ids)
        file.changed()
        self.alloc.decref(plan._replaced)
        self.prefix_cache.register_full_pages(file)
        file.touch()
        self._maybe_free(file)

    # ------------------------------------------------------------------- prefix cache
    @_locked
    def map_cached_prefix(self, owner: Owner, h: int, tokens: Sequence[int], limit: int) -> int:
        """Start a fresh file (no tokens yet) from the longest prefix of ``tokens`` whose whole
        pages the tenant has cached, instead of computing it; at most ``limit`` tokens (the
        caller needs the logits of position ``limit``, so it must compute it). Returns how many
        tokens were mapped: they are now the file's computed tokens, on shared pages."""
        handle = self._handles.get(owner, h)
        file = handle.file
        if not file.cache or file.tokens or file.pages or file.plan_pending:
            return 0
        try:
            pages, keys = self.prefix_cache.match(file.tenant, tokens, limit)
        except (OverflowError, TypeError, ValueError):
            return 0  # not token ids: the append that follows refuses them
        if not pages:
            return 0
        cap = self.budgets.session_cap(owner)
        if cap is not None and self.session_usage(owner) + len(pages) > cap:
            return 0  # computing it would not fit either; let the append say so
        if file.name is not None and not self.budgets.stored_fits(file.tenant, len(pages)):
            return 0  # a named file is stored: past its account's stored bytes, the append says so
        self.alloc.incref(file.tenant, pages)
        n = len(pages) * self.block_size
        file.tokens = [int(t) for t in tokens[:n]]
        file.computed = n
        file.pages = list(pages)
        file.chain = keys
        file.registered = len(pages)
        file.changed()
        file.touch()
        log.debug("event=kv_prefix_hit file=%s tokens=%d", file.path, n)
        return n

    @_locked
    def prefix_cached_pages(self, tenant: str | None = None) -> int:
        """Pages only the prefix cache holds (reclaimed first when pages are needed)."""
        return self.prefix_cache.cached_only(tenant)

    @_locked
    def abort_append(self, plan: AppendPlan) -> None:
        file = self._finish(plan)
        self.alloc.decref(plan._allocated)
        self._maybe_free(file)

    # ------------------------------------------------------------------ tiers and budgets
    def _spill(self, file: KVFile) -> None:
        self.placement.spill(file)

    def _reserve(self, tenant: str, n: int) -> None:
        self.placement.reserve(tenant, n)

    @_locked
    def reclaimable_pages(self) -> int:
        """Device pages a new request could get now: free ones plus those of idle unpinned
        named files (of any tenant), which are spilled before any request is refused."""
        return self.placement.reclaimable()

    def _ensure_device(self, file: KVFile) -> None:
        self.placement.ensure_device(file)

    @_locked
    def swap_out(self, owner: Owner) -> int:
        """Move the session's private files to host memory while it waits; returns pages freed.

        A file sharing pages with a file that stays (a fork of a stored context, as every agent
        of a team holds) stays too: moving it frees only its own pages, and bringing it back
        allocates all of them, the shared ones as private copies, so N waiting forks of one
        context would come back as N copies of it (and fail with ENOSPC where the pages were
        budgeted shared). References of the prefix index do not count: a page only the index
        holds is reclaimable anyway."""
        return self.placement.swap_out(owner)

    @_locked
    def swap_in(self, owner: Owner) -> None:
        for file in self.catalogue.session_files(owner):
            self._ensure_device(file)

    @_locked
    def evict(self, tenant: str, name: str) -> None:
        """Explicitly move a named file to disk, freeing its device pages and host memory."""
        file = self.coherence.lookup(tenant, name)
        if file.handles or file.plan_pending:
            raise Busy(f"KV file {name!r} is open")
        self.tiers.to_disk(file)

    @_locked
    def flush(self) -> None:
        """Write every named file with unflushed changes to the store and give every write
        lease back (graceful shutdown); residency is unchanged. Clean copies are not written:
        the store has them, maybe already at a newer generation from another worker."""
        self.coherence.flush_all()

    @_locked
    def renew_leases(self) -> int:
        """Renew the write leases this worker holds once a third of their TTL has passed (called
        from the worker's tick); a lease lost meanwhile is logged and dropped. Returns renewals."""
        return self.coherence.renew()

    @_locked
    def load_index(self) -> int:
        """Rebuild the catalogue from the store at start: every file is disk-resident."""
        return self.coherence.load_index()

    # ------------------------------------------------------------------------ views
    @_locked
    def stats(self) -> KVStats:
        return self.metering.stats()

    @_locked
    def store_capacity(self, configured: int | None = None) -> int | None:
        """The KV store's bytes for named files (``PoolName.KV_STORE_BYTES``): ``configured``
        when given, else, for a store on a local disk, the disk's free bytes now plus what the
        named files already hold (the index loaded); ``None`` for an object store."""
        if configured is not None:
            return max(0, configured)
        root = getattr(self.store, "root", None)
        if root is None:
            return None
        held = self.catalogue.stored_pages(None) * self.page_bytes
        return shutil.disk_usage(root).free + held

    @_locked
    def session_usage(self, owner: Owner) -> int:
        """Distinct device pages held by the session's open files now."""
        return self.metering.session_usage(owner)

    @_locked
    def live_usage(self, owners: Sequence[Owner]) -> list[tuple[dict[str, int], float]]:
        """Per session: the fields of its live ``kv`` event and the distinct device pages it
        holds (what page-seconds are metered on); gpu_worker/kvfs/metering.py."""
        return self.metering.live_usage(owners)

    @_locked
    def list_files(self, tenant: str | None = None) -> list[KVFileInfo]:
        return self.metering.list_files(tenant)

    @_locked
    def check(self) -> None:
        """Assert global invariants: refcounts equal references from live files, no leaks."""
        self.metering.check()
