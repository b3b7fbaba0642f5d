"""The KVFS facade: KV files as the session server and scheduler see them.

All bookkeeping happens under one lock; page contents move only through ``PageIO`` (the
engine). Appends are two-phase: ``plan_append`` reserves pages and says what the forward must
compute, ``commit_append`` makes it visible, ``abort_append`` gives everything back, so a
failed forward loses nothing.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gpu_worker.kvfs.errors import Busy, Exists, InvalidArgument, NoSpace, NotFound
from gpu_worker.kvfs.files import (
    DEVICE,
    DISK,
    HOST,
    STORE_SUFFIX,
    Handle,
    HandleTable,
    KVFile,
    Owner,
    pages_for,
    store_key,
    validate_name,
    validate_tenant,
)
from gpu_worker.kvfs.pages import PageAllocator
from gpu_worker.kvfs.stats import KVFileInfo, KVStats
from gpu_worker.kvfs.store import KVStore
from gpu_worker.kvfs.tiers import PageIO, Tiers, decode_header

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])


def _locked(method: F) -> F:
    @functools.wraps(method)
    def wrapper(self: KVFS, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


@dataclass(frozen=True)
class KVFSLimits:
    """Per-tenant budgets; ``None`` means unlimited (bounded by the pool itself)."""

    device_pages_per_tenant: int | None = None
    stored_bytes_per_tenant: int | None = None
    max_handles_per_session: int = 1024


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
    ) -> None:
        """``on_release(seq_id)`` is called when no handle uses a file any more (pass ``Engine.release``)."""
        self.block_size = block_size
        self.page_bytes = page_bytes
        self.limits = limits or KVFSLimits()
        self.alloc = PageAllocator(num_pages)
        self.tiers = Tiers(self.alloc, page_io, store, host_pages)
        self.page_io = page_io
        self.store = store
        self._handles = HandleTable()
        self._named: dict[tuple[str, str], KVFile] = {}
        self._lock = threading.RLock()
        self._on_release = on_release
        self._session_limits: dict[Owner, int] = {}
        self._tenant_stored_limits: dict[str, int] = {}

    # ----------------------------------------------------------------- handles and files
    def _new_handle(self, owner: Owner, file: KVFile) -> int:
        validate_tenant(owner.tenant)
        if len(self._handles.of_session(owner)) >= self.limits.max_handles_per_session:
            raise NoSpace(f"too many open KV handles (limit {self.limits.max_handles_per_session})")
        file.touch()
        return self._handles.add(owner, file).hid

    def _get(self, owner: Owner, h: object) -> Handle:
        handle = self._handles.get(owner, h)
        self._ensure_device(handle.file)
        return handle

    def _lookup(self, tenant: str, name: str) -> KVFile:
        key = (validate_tenant(tenant), validate_name(name))
        file = self._named.get(key)
        if file is None:
            raise NotFound(f"no KV file named {name!r}")
        return file

    def _share(self, src: KVFile, n_tokens: int) -> KVFile:
        """A new anonymous file with ``src``'s first ``n_tokens``, sharing their pages (COW)."""
        computed = min(src.computed, n_tokens)
        pages = src.pages[: pages_for(computed, self.block_size)]
        self.alloc.incref(src.tenant, pages)
        return KVFile(tenant=src.tenant, tokens=src.tokens[:n_tokens], computed=computed, pages=list(pages))

    def _maybe_free(self, file: KVFile) -> None:
        """Anonymous (or unlinked) files die with their last handle; the engine forgets idle files."""
        if file.handles or file.plan_pending:
            return
        if self._on_release is not None:
            self._on_release(file.seq_id)
        if file.name is None:
            self.tiers.drop(file)

    @_locked
    def create(self, owner: Owner, name: str | None = None) -> int:
        """A new empty file; named files are persistent and opened for writing."""
        file = KVFile(tenant=validate_tenant(owner.tenant))
        if name is not None:
            key = (owner.tenant, validate_name(name))
            if key in self._named:
                raise Exists(f"KV file {name!r} already exists")
            file.name = name
            self._named[key] = file
        hid = self._new_handle(owner, file)
        if name is not None:
            file.writer = hid
        log.info("event=kv_create tenant=%s session=%s file=%s", owner.tenant, owner.session, file.path)
        return hid

    @_locked
    def open(self, owner: Owner, name: str, mode: str = "r") -> int:
        """Open a named file of the owner's tenant, reloading it from host or disk.

        ``"w"`` gives the exclusive writer handle to the file itself; ``"r"`` gives a private
        copy-on-write fork, so a reader's appends never change the stored file.
        """
        if mode not in ("r", "w"):
            raise InvalidArgument("mode must be 'r' or 'w'")
        file = self._lookup(owner.tenant, name)
        if mode == "w" and file.writer is not None:
            raise Busy(f"KV file {name!r} is already open for writing")
        self._ensure_device(file)
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

    @_locked
    def close(self, owner: Owner, h: int) -> None:
        handle = self._handles.get(owner, h)
        self._handles.pop(handle.hid)
        file = handle.file
        if file.writer == handle.hid:
            file.writer = None
        file.touch()
        if file.persistent and file.dirty and not file.handles and file.residency != DISK:
            self._write_through(file)
        self._maybe_free(file)

    def _write_through(self, file: KVFile) -> None:
        """Persist a named file whose last handle closed, so a worker crash loses no closed
        file. A failing store (disk full) is logged and retried at the next close or at
        shutdown; the file stays intact on device meanwhile."""
        try:
            self.tiers.write_disk(file)
            file.dirty = False
        except Exception as exc:
            log.warning("event=kv_write_through_failed file=%s error=%r", file.path, exc)

    @_locked
    def set_session_limit(self, owner: Owner, max_pages: int | None) -> None:
        """Cap the device pages a session's open files may hold (the run's ``max_pages``)."""
        if max_pages is None:
            self._session_limits.pop(owner, None)
        else:
            self._session_limits[owner] = max_pages

    @_locked
    def set_tenant_stored_limit(self, tenant: str, max_bytes: int | None) -> None:
        """The tenant's plan budget for named (persistent) KV files, overriding
        ``KVFSLimits.stored_bytes_per_tenant``; the control plane sends it with each session."""
        if max_bytes is None:
            self._tenant_stored_limits.pop(tenant, None)
        else:
            self._tenant_stored_limits[tenant] = max_bytes

    @_locked
    def close_session(self, owner: Owner) -> None:
        for handle in self._handles.of_session(owner):
            self.close(owner, handle.hid)
        self._session_limits.pop(owner, None)

    @_locked
    def remove(self, tenant: str, name: str) -> None:
        """Unlink a named file; open handles keep it alive as an anonymous file."""
        file = self._lookup(tenant, name)
        del self._named[(tenant, name)]
        self.store.delete(store_key(tenant, name))
        if file.residency == DISK:
            file.residency = DEVICE
            file.spilled_pages = 0
            file.computed = 0
        file.name = None
        self._maybe_free(file)
        log.info("event=kv_remove tenant=%s name=%s", tenant, name)

    delete = remove

    @_locked
    def remove_tenant(self, tenant: str) -> list[str]:
        """Unlink every named file of ``tenant`` and delete everything it has in the store,
        catalogued here or not: a store shared with other workers (S3) may hold files this worker
        never listed, written by one that is gone. Returns the names removed, sorted. Open
        handles keep their pages as anonymous files, as with :meth:`remove`."""
        prefix = validate_tenant(tenant) + "/"
        names = {name for (owner, name) in self._named if owner == tenant}
        for name in names:
            self.remove(tenant, name)
        for key in self.store.list(prefix):
            self.store.delete(key)
            if key.endswith(STORE_SUFFIX):
                names.add(key[len(prefix) : -len(STORE_SUFFIX)])
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
        file.dirty = file.persistent
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
        file = KVFile(tenant=src.tenant, tokens=src.tokens[start:end])
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
        self._lookup(tenant, name).pinned = bool(pinned)

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
        stored_limit = self._tenant_stored_limits.get(file.tenant, self.limits.stored_bytes_per_tenant)
        if file.name is not None and stored_limit is not None:
            stored = self._stored_bytes(file.tenant) + grow * self.page_bytes
            if stored > stored_limit:
                raise NoSpace(f"stored KV budget of tenant exceeded: {stored} > {stored_limit} bytes")
        limit = self._session_limits.get(owner)
        if limit is not None and self.session_usage(owner) + n_alloc > limit:
            raise NoSpace(
                f"session KV page limit exceeded: {self.session_usage(owner)} held + {n_alloc} needed > {limit} pages"
            )
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
        file.dirty = file.persistent
        self.alloc.decref(plan._replaced)
        file.touch()
        self._maybe_free(file)

    @_locked
    def abort_append(self, plan: AppendPlan) -> None:
        file = self._finish(plan)
        self.alloc.decref(plan._allocated)
        self._maybe_free(file)

    # ------------------------------------------------------------------ tiers and budgets
    def _stored_bytes(self, tenant: str) -> int:
        return sum(f.n_pages for (t, _), f in self._named.items() if t == tenant) * self.page_bytes

    def _evictable(self, tenant: str | None = None) -> list[KVFile]:
        """Idle, unpinned, device-resident named files, least recently used first."""
        files = [
            f
            for f in self._named.values()
            if f.residency == DEVICE
            and f.pages
            and not f.pinned
            and not f.handles
            and not f.plan_pending
            and (tenant is None or f.tenant == tenant)
        ]
        return sorted(files, key=lambda f: f.use_seq)

    def _spill(self, file: KVFile) -> None:
        """Device -> host when host memory has room (making room by dropping other files' clean
        copies, then by moving older host files to disk), else disk. A file with a clean copy
        goes to host without a copy and needs no room."""
        if self.tiers.has_clean_copy(file):
            self.tiers.device_to_host(file)
            return
        need = len(file.pages)
        if need > self.tiers.host_capacity:
            self.tiers.to_disk(file)
            return
        host_files = sorted(
            (f for f in self._named.values() if f.residency == HOST and not f.handles), key=lambda f: f.use_seq
        )
        clean = sorted((f for f in self._named.values() if self.tiers.has_clean_copy(f)), key=lambda f: f.use_seq)
        while self.tiers.host_capacity - self.tiers.host_used < need and clean:
            self.tiers.forget_clean_copy(clean.pop(0))
        while self.tiers.host_capacity - self.tiers.host_used < need and host_files:
            self.tiers.to_disk(host_files.pop(0))
        if self.tiers.host_capacity - self.tiers.host_used >= need:
            self.tiers.device_to_host(file)
        else:
            self.tiers.to_disk(file)

    def _reserve(self, tenant: str, n: int) -> None:
        """Make ``n`` pages allocatable for ``tenant`` by LRU eviction, or raise ENOSPC."""
        budget = self.limits.device_pages_per_tenant
        if budget is not None and self.alloc.tenant_pages(tenant) + n > budget:
            for victim in self._evictable(tenant):
                self._spill(victim)
                if self.alloc.tenant_pages(tenant) + n <= budget:
                    break
            if self.alloc.tenant_pages(tenant) + n > budget:
                raise NoSpace(
                    f"device KV page budget of tenant exceeded: {self.alloc.tenant_pages(tenant)} held "
                    f"+ {n} needed > {budget} pages"
                )
        if self.alloc.free_count < n:
            for victim in self._evictable():
                self._spill(victim)
                if self.alloc.free_count >= n:
                    break
            if self.alloc.free_count < n:
                raise NoSpace(f"KV cache full: {n} pages needed, {self.alloc.free_count} free")

    def _ensure_device(self, file: KVFile) -> None:
        if file.residency != DEVICE:
            self._reserve(file.tenant, file.spilled_pages)
            self.tiers.reload(file)

    @_locked
    def swap_out(self, owner: Owner) -> int:
        """Move the session's private files to host memory while it waits; returns pages freed."""
        freed = 0
        for file in {h.file for h in self._handles.of_session(owner)}:
            others = any(self._handles.owner_of(hid) != owner for hid in file.handles)
            if file.residency == DEVICE and file.pages and not file.plan_pending and not others:
                before = self.alloc.free_count
                self.tiers.device_to_host(file)
                freed += self.alloc.free_count - before
        return freed

    @_locked
    def swap_in(self, owner: Owner) -> None:
        for file in {h.file for h in self._handles.of_session(owner)}:
            self._ensure_device(file)

    @_locked
    def evict(self, tenant: str, name: str) -> None:
        """Explicitly move a named file to disk, freeing its device pages and host memory."""
        file = self._lookup(tenant, name)
        if file.handles or file.plan_pending:
            raise Busy(f"KV file {name!r} is open")
        self.tiers.to_disk(file)

    @_locked
    def flush(self) -> None:
        """Write every named file to the store (graceful shutdown); residency is unchanged."""
        for file in self._named.values():
            if file.residency != DISK:
                self.tiers.write_disk(file)
                file.dirty = False

    @_locked
    def load_index(self) -> int:
        """Rebuild the catalogue from the store at start: every file is disk-resident."""
        found = []
        for key in self.store.list():
            if not key.endswith(STORE_SUFFIX):
                continue
            meta = decode_header(self.store.get(key))
            tenant, name = meta["tenant"], meta["name"]
            if (tenant, name) in self._named or store_key(tenant, name) != key:
                continue
            found.append(meta)
        # Oldest first, so the logical LRU clock continues the stored order.
        for meta in sorted(found, key=lambda m: float(m.get("last_used", "0"))):
            self._named[(meta["tenant"], meta["name"])] = KVFile(
                tenant=meta["tenant"],
                name=meta["name"],
                tokens=[int(t) for t in json.loads(meta["tokens"])],
                computed=int(meta["computed"]),
                pinned=meta.get("pinned") == "1",
                last_used=float(meta.get("last_used", "0")),
                residency=DISK,
                spilled_pages=int(meta["n_pages"]),
            )
        loaded = len(found)
        return loaded

    # ------------------------------------------------------------------------ views
    @_locked
    def stats(self) -> KVStats:
        files = list(self._named.values())
        return KVStats(
            total_pages=self.alloc.usable,
            free_pages=self.alloc.free_count,
            used_pages=self.alloc.usable - self.alloc.free_count,
            pages_per_tenant=self.alloc.per_tenant(),
            host_pages=self.tiers.host_used,
            host_clean_pages=self.tiers.clean_pages,
            host_capacity_pages=self.tiers.host_capacity,
            disk_pages=sum(f.spilled_pages for f in files if f.residency == DISK),
            files=len(files),
            open_handles=len(self._handles),
        )

    def _held(self, owner: Owner) -> tuple[set[int], int]:
        """The distinct pages and the tokens of the session's open files (lock held)."""
        pages: set[int] = set()
        tokens = 0
        for handle in self._handles.of_session(owner):
            pages.update(handle.file.pages)
            tokens += len(handle.file.tokens)
        return pages, tokens

    @_locked
    def session_usage(self, owner: Owner) -> int:
        """Distinct device pages held by the session's open files now."""
        return len(self._held(owner)[0])

    @_locked
    def live_usage(self, owners: Sequence[Owner]) -> list[tuple[dict[str, int], int]]:
        """Per session: the fields of its live ``kv`` event and the distinct device pages it
        holds (what page-seconds are metered on). One call for every live session, so the
        worker's tick takes the lock and the file system's totals once, not twice per session."""
        st = self.stats()
        out = []
        for owner in owners:
            pages, tokens = self._held(owner)
            event = {
                "device_pages": st.used_pages,
                "host_pages": st.host_pages,
                "disk_pages": st.disk_pages,
                "tenant_device_pages": st.pages_per_tenant.get(owner.tenant, 0),
                "tokens": tokens,
            }
            out.append((event, len(pages)))
        return out

    @_locked
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
            )
            for (t, _), f in self._named.items()
            if tenant is None or t == tenant
        ]
        return sorted(rows, key=lambda r: (r.tenant, r.name))

    @_locked
    def check(self) -> None:
        """Assert global invariants: refcounts equal references from live files, no leaks."""
        self.alloc.check()
        live: set[int] = set()
        refs: Counter[int] = Counter()
        files = {id(h.file): h.file for h in self._handles.all()}
        files.update({id(f): f for f in self._named.values()})
        for f in files.values():
            if f.residency == DEVICE:
                assert len(f.pages) == pages_for(f.computed, self.block_size), f.path
                refs.update(f.pages)
                live.update(f.pages)
            assert all(self.alloc.owner(p) == f.tenant for p in f.pages)
        held_on_host = sum(f.host_data.shape[0] for f in files.values() if f.host_data is not None)
        assert self.tiers.host_used == held_on_host, (self.tiers.host_used, held_on_host)
        clean = sum(f.host_data.shape[0] for f in files.values() if self.tiers.has_clean_copy(f))
        assert self.tiers.clean_pages == clean, (self.tiers.clean_pages, clean)
        for p in range(1, self.alloc.num_pages):
            # Pages reserved by in-flight plans are the only references not held by a file.
            assert self.alloc.refcount(p) >= refs[p], p
        if not any(f.plan_pending for f in files.values()):
            for p in range(1, self.alloc.num_pages):
                assert self.alloc.refcount(p) == refs[p], (p, self.alloc.refcount(p), refs[p])
