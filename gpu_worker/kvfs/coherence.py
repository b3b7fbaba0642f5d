"""Store and lease coherence: this worker's copies of named files against the shared store.

Named files are shared with every worker using the same store. A write lease with a
generation number (gpu_worker/kvfs/lease.py) gives each file one writer at a time, and a cached
copy is checked against the store's generation whenever it is looked up, so no worker serves a
stale copy or flushes one over a newer write. This module keeps that promise: it finds a named
file at its latest flushed generation (this worker's copy, or one loaded from the store),
takes, renews and gives back write leases, writes a file as its next generation, and unlinks
one from the store. It takes no lock: the ``KVFS`` facade holds its lock around every call.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable

from gpu_worker.kvfs.catalogue import Catalogue
from gpu_worker.kvfs.errors import NotFound
from gpu_worker.kvfs.files import DEVICE, DISK, STORE_SUFFIX, KVFile, store_key, validate_name, validate_tenant
from gpu_worker.kvfs.lease import LeaseLost, Leases, StoreUnavailable
from gpu_worker.kvfs.store import KVStore
from gpu_worker.kvfs.tiers import Tiers, decode_header

log = logging.getLogger(__name__)

#: ``written_generation`` of an unlinked file: past any generation a write could carry.
UNLINKED = sys.maxsize


def file_from_meta(meta: dict[str, str]) -> KVFile:
    """The catalogue entry of a file found in the store: disk-resident, at the stored generation."""
    return KVFile(
        tenant=meta["tenant"],
        name=meta["name"],
        tokens=[int(t) for t in json.loads(meta["tokens"])],
        computed=int(meta["computed"]),
        pinned=meta.get("pinned") == "1",
        durable=meta.get("durable", "1") == "1",
        last_used=float(meta.get("last_used", "0")),
        residency=DISK,
        spilled_pages=int(meta["n_pages"]),
        generation=int(meta.get("generation", "0")),
        stored=True,
    )


def held_here(file: KVFile) -> bool:
    """This worker's copy is the newest there is: it is being written here, or holds changes
    not flushed yet (under this worker's write lease)."""
    return file.writer is not None or file.plan_pending or file.dirty or not file.stored


class Coherence:
    """Named files at their latest generation, and the write leases this worker holds."""

    def __init__(
        self,
        store: KVStore,
        leases: Leases,
        catalogue: Catalogue,
        tiers: Tiers,
        release_seq: Callable[[str], None],
    ) -> None:
        """``release_seq(seq_id)`` tells the engine a dropped copy's sequence is gone."""
        self.store = store
        self.leases = leases
        self.catalogue = catalogue
        self.tiers = tiers
        self._release_seq = release_seq
        #: Named files whose write lease this worker holds, with when it was last renewed.
        self.leased: dict[tuple[str, str], float] = {}

    # ---------------------------------------------------------------------- lookup
    def lookup(self, tenant: str, name: str) -> KVFile:
        """The named file at its latest flushed generation: this worker's copy when it holds the
        write lease or the copy is still the store's generation, else (re)loaded from the store
        (a file another worker wrote since this one started, or changed since it was cached)."""
        key = (validate_tenant(tenant), validate_name(name))
        local = self.catalogue.named.get(key)
        if local is not None and held_here(local):
            return local
        lease = self.leases.read(tenant, name)
        if local is not None:
            if lease is not None and lease.generation == local.generation:
                return local
            if lease is None and local.generation == 0 and self.in_store(tenant, name):
                return local  # written before leases existed; no other worker has changed it
            why = "deleted" if lease is None else f"generation {lease.generation} written"
            log.info("event=kv_stale_dropped file=%s generation=%d reason=%s", local.path, local.generation, why)
            self.forget(local)
        file = self.load_from_store(tenant, name)
        if file is None:
            raise NotFound(f"no KV file named {name!r}")
        return file

    def in_store(self, tenant: str, name: str) -> bool:
        try:
            self.store.size(store_key(tenant, name))
        except KeyError:
            return False
        except Exception as exc:
            raise StoreUnavailable(f"the KV store is unreachable: {type(exc).__name__}: {exc}") from exc
        return True

    def load_from_store(self, tenant: str, name: str) -> KVFile | None:
        """Catalogue a file found in the store (disk-resident; its pages load when opened)."""
        try:
            blob = self.store.get(store_key(tenant, name))
        except KeyError:
            return None
        except Exception as exc:
            raise StoreUnavailable(f"the KV store is unreachable: {type(exc).__name__}: {exc}") from exc
        file = file_from_meta(decode_header(blob))
        self.catalogue.named[(tenant, name)] = file
        log.info("event=kv_found_in_store file=%s generation=%d", file.path, file.generation)
        return file

    def forget(self, file: KVFile) -> None:
        """Drop this worker's stale clean copy of a named file (no handle uses it)."""
        del self.catalogue.named[(file.tenant, file.name or "")]
        self._release_seq(file.seq_id)
        self.tiers.drop(file)

    def load_index(self) -> int:
        """Catalogue every file in the store not catalogued yet, oldest first (so the logical
        LRU clock continues the stored order); returns how many."""
        found = []
        for key in self.store.list():
            if not key.endswith(STORE_SUFFIX):
                continue
            meta = decode_header(self.store.get(key))
            tenant, name = meta["tenant"], meta["name"]
            if (tenant, name) in self.catalogue.named or store_key(tenant, name) != key:
                continue
            found.append(meta)
        for meta in sorted(found, key=lambda m: float(m.get("last_used", "0"))):
            self.catalogue.named[(meta["tenant"], meta["name"])] = file_from_meta(meta)
        return len(found)

    # ---------------------------------------------------------------------- leases
    def acquire(self, tenant: str, name: str, *, create: bool = False) -> int:
        """Take the file's write lease; returns the store generation it is at."""
        lease = self.leases.acquire(tenant, name, create=create)
        self.leased[(tenant, name)] = time.monotonic()
        return lease.generation

    def release(self, file: KVFile) -> None:
        if self.leased.pop((file.tenant, file.name or ""), None) is not None:
            self.leases.release(file.tenant, file.name or "")

    def bump(self, file: KVFile) -> int:
        """Reserve the file's next generation under this worker's lease (LeaseLost if it is gone)."""
        generation = self.leases.bump(file.tenant, file.name or "")
        self.leased[(file.tenant, file.name or "")] = time.monotonic()
        return generation

    def lost(self, file: KVFile) -> None:
        """The lease of ``file`` was taken over or the file deleted elsewhere: this copy must not
        be written over the newer one, so it becomes anonymous here."""
        self.leased.pop((file.tenant, file.name or ""), None)
        del self.catalogue.named[(file.tenant, file.name or "")]
        file.name = None

    def persist(self, file: KVFile) -> None:
        """Write a named file under this worker's lease as the next generation."""
        assert file.name is not None
        file.generation = self.bump(file)
        self.tiers.write_disk(file)

    def persist_closed(self, file: KVFile) -> None:
        """Flush a file no handle writes any more and give its lease back."""
        self.persist(file)
        if file.writer is None:
            self.release(file)

    def renew(self) -> int:
        """Renew the leases held once a third of their TTL has passed; a lease lost meanwhile is
        logged and dropped. Returns renewals."""
        renewed = 0
        now = time.monotonic()
        for (tenant, name), at in list(self.leased.items()):
            if now - at < self.leases.ttl_s / 3:
                continue
            try:
                self.leases.renew(tenant, name)
            except LeaseLost as exc:
                log.error("event=kv_lease_lost tenant=%s name=%s error=%s", tenant, name, exc.message)
                self.leased.pop((tenant, name), None)
                continue
            except Exception as exc:  # store down: retried next tick, within the TTL
                log.warning("event=kv_lease_renew_failed tenant=%s name=%s error=%r", tenant, name, exc)
                continue
            self.leased[(tenant, name)] = now
            renewed += 1
        return renewed

    def flush_all(self) -> None:
        """Write every named file with unflushed changes and give every lease back; clean
        copies are not written (the store has them, maybe already at a newer generation)."""
        for file in list(self.catalogue.named.values()):
            if file.residency != DISK and (file.dirty or not file.stored):
                try:
                    self.persist(file)
                except LeaseLost as exc:
                    log.error("event=kv_write_conflict file=%s error=%s", file.path, exc.message)
        for tenant, name in list(self.leased):
            self.leased.pop((tenant, name), None)
            self.leases.release(tenant, name)

    # ---------------------------------------------------------------------- unlink
    def unlink(self, file: KVFile) -> None:
        """Delete a named file from the catalogue, the store and its lease; the copy here
        becomes anonymous (the caller frees it once no handle uses it)."""
        tenant, name = file.tenant, file.name or ""
        del self.catalogue.named[(tenant, name)]
        self.leased.pop((tenant, name), None)
        try:
            with file.write_lock:  # after a write in flight; none may land after the delete
                self.store.delete(store_key(tenant, name))
                file.written_generation = UNLINKED
        except Exception as exc:
            raise StoreUnavailable(f"the KV store is unreachable: {type(exc).__name__}: {exc}") from exc
        self.leases.delete(tenant, name)  # after the blob: a reader never finds a lease-less blob newer than its copy
        if file.residency == DISK:
            file.residency = DEVICE
            file.spilled_pages = 0
            file.computed = 0
        file.name = None
        log.info("event=kv_remove tenant=%s name=%s", tenant, name)

    def delete_tenant(self, tenant: str) -> set[str]:
        """Delete everything ``tenant`` has in the store, catalogued here or not (a store shared
        with other workers may hold files this worker never listed); the names of its files."""
        prefix = validate_tenant(tenant) + "/"
        names = set()
        for key in self.store.list(prefix):
            self.store.delete(key)
            if key.endswith(STORE_SUFFIX):
                names.add(key[len(prefix) : -len(STORE_SUFFIX)])
        return names
