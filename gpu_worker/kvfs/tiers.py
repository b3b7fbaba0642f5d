"""Moving KV files between tiers: device pages -> host tensors -> safetensors on the KV store.

Only page *data* moves here (through ``PageIO``); which file moves when is decided by the KVFS
facade. Reloading writes into freshly allocated pages, except for the leading pages KVFS finds
in the tenant's prefix cache (``reload(lead=...)``), which are mapped shared instead.

A file reloaded from host memory keeps its host tensor as a *clean copy* while nothing writes to
it (``KVFile.host_data`` on a device-resident file; KVFS drops it before any append or truncate).
Spilling such a file again is then free: its pages are released without a copy. On a CPU, where
a 1024-token document's KV is a 47 MB memcpy each way plus the page faults of a fresh 47 MB
buffer, a miss of B1's RAG workload (spill one document, reload another) took its `kv_open` from
50-69 ms to 16-27 ms (medians) here; on a GPU it saves the device-to-host copy.
The copy stays counted in ``host_used``, and is the first thing given up when host memory is short.
"""

from __future__ import annotations

import json
import logging
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from gpu_worker.kvfs.files import DEVICE, DISK, HOST, KVFile, store_key
from gpu_worker.kvfs.pages import PageAllocator
from gpu_worker.kvfs.store import KVStore

log = logging.getLogger(__name__)


#: The tier a reload read from the store is named so in a run's trace (``disk`` is the
#: residency; the bytes come from the KV store, a directory or an object store).
STORE = "store"


@dataclass(frozen=True)
class TierMove:
    """One file's KV brought back to the device, for the trace of the session that asked
    (``KVFS.open(moves=...)``): from ``host`` or ``store``, its bytes (the blob read from the
    store, or the host tensor copied), ``time.monotonic()`` bounds."""

    src: str
    nbytes: int
    start: float
    end: float
    dst: str = DEVICE


class PageIO(Protocol):
    """What KVFS needs from the engine to move page contents."""

    def read_pages(self, page_ids: Sequence[int]) -> torch.Tensor: ...

    def write_pages(self, page_ids: Sequence[int], data: torch.Tensor) -> None: ...


def encode_meta(file: KVFile, n_pages: int) -> dict[str, str]:
    """A blob's metadata: what the file is besides its pages, as it is now."""
    return {
        "tenant": file.tenant,
        "name": file.name or "",
        "tokens": json.dumps(file.tokens),
        "computed": str(file.computed),
        "pinned": "1" if file.pinned else "0",
        "durable": "1" if file.durable else "0",
        "last_used": repr(file.last_used),
        "n_pages": str(n_pages),
        "generation": str(file.generation),
    }


def encode_blob(data: torch.Tensor, meta: dict[str, str]) -> bytes:
    """A safetensors blob: tensor ``kv`` plus the file's metadata (:func:`encode_meta`)."""
    return st_save({"kv": data.contiguous()}, metadata=meta)


def encode(file: KVFile, data: torch.Tensor) -> bytes:
    return encode_blob(data, encode_meta(file, data.shape[0]))


def put_generation(store: KVStore, file: KVFile, generation: int, blob: bytes) -> bool:
    """Put ``blob`` as ``file``'s ``generation`` unless the store already got a newer one from
    this worker (or the file was unlinked); returns whether it was written. Every store write of
    a named file goes through here, so one made outside the KVFS lock can never land over a
    newer one. (Generations are unique per write under a lease; 0 is a file written without
    one, as Tiers alone does.)"""
    with file.write_lock:
        if generation < file.written_generation:
            return False
        store.put(store_key(file.tenant, file.name or ""), blob)
        file.written_generation = generation
        return True


def decode_header(blob: bytes) -> dict[str, str]:
    """Only the metadata of a blob (no tensor copy): used to rebuild the index."""
    (n,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8 : 8 + n]).get("__metadata__", {})


def decode_data(blob: bytes) -> torch.Tensor:
    return st_load(blob)["kv"]


class Tiers:
    """Spill and reload of whole files; the caller holds the KVFS lock."""

    def __init__(
        self,
        alloc: PageAllocator,
        page_io: PageIO,
        store: KVStore,
        host_pages: int,
        persist: Callable[[KVFile], None] | None = None,
    ) -> None:
        """``persist(file)`` writes a named file with unflushed changes to the store under its
        lease (KVFS); a clean file already in the store is dropped to disk without a write, so a
        worker's stale copy can never overwrite a newer generation written by another."""
        self.alloc = alloc
        self.persist = persist or self.write_disk
        self.page_io = page_io
        self.store = store
        self.host_capacity = host_pages
        #: Host pages held: spilled files and clean copies of device-resident ones.
        self.host_used = 0
        #: The part of ``host_used`` that is clean copies (droppable at no cost).
        self.clean_pages = 0

    def has_clean_copy(self, file: KVFile) -> bool:
        """A device-resident file whose host tensor still equals its pages."""
        return file.residency == DEVICE and file.host_data is not None

    def device_to_host(self, file: KVFile) -> None:
        """Move a device file's pages to host memory (no copy when it has a clean one)."""
        assert file.residency == DEVICE
        clean = self.has_clean_copy(file)
        if clean:
            self.clean_pages -= len(file.pages)
        else:
            file.host_data = self.page_io.read_pages(file.pages) if file.pages else None
            self.host_used += len(file.pages)
        self.alloc.decref(file.pages)
        file.spilled_pages = len(file.pages)
        file.pages = []
        file.residency = HOST
        log.info("event=kv_spill tier=host file=%s pages=%d copied=%d", file.path, file.spilled_pages, not clean)

    def forget_clean_copy(self, file: KVFile) -> None:
        """Drop a device file's clean host copy: about to be written, or host memory is short."""
        if self.has_clean_copy(file):
            assert file.host_data is not None
            self.host_used -= file.host_data.shape[0]
            self.clean_pages -= file.host_data.shape[0]
            file.host_data = None

    def host_data_of(self, file: KVFile) -> torch.Tensor:
        if file.residency == DEVICE:
            if file.host_data is not None:
                return file.host_data
            return self.page_io.read_pages(file.pages)
        if file.residency == HOST:
            return file.host_data if file.host_data is not None else self._empty()
        return decode_data(self.store.get(store_key(file.tenant, file.name or "")))

    def _empty(self) -> torch.Tensor:
        return self.page_io.read_pages([])

    def write_disk(self, file: KVFile) -> int:
        """Persist a named file's current KV to the store; returns the blob size."""
        assert file.name is not None
        blob = encode(file, self.host_data_of(file))
        put_generation(self.store, file, file.generation, blob)
        file.stored, file.dirty = True, False
        return len(blob)

    def to_disk(self, file: KVFile) -> None:
        """Spill a named file to the store and free its device pages / host memory."""
        assert file.name is not None
        if file.residency == DISK:
            return
        if file.dirty or not file.stored:
            self.persist(file)
        n = file.n_pages
        if file.residency == DEVICE:
            self.forget_clean_copy(file)
            self.alloc.decref(file.pages)
            file.pages = []
        else:
            self.host_used -= file.spilled_pages
            file.host_data = None
        file.spilled_pages = n
        file.residency = DISK
        log.info("event=kv_spill tier=disk file=%s pages=%d", file.path, n)

    def reload(self, file: KVFile, lead: Sequence[int] = (), moves: list[TierMove] | None = None) -> None:
        """Bring a spilled file back onto device pages (caller checked the budget): ``lead``
        are pages already holding its first pages' KV (the prefix cache's, referenced for the
        file by the caller), the rest are fresh pages written from the spilled copy. A host
        tensor stays as the file's clean copy (see the module docstring). ``moves``, when
        given, gets a :class:`TierMove` of what was read and copied."""
        if file.residency == DEVICE:
            return
        began = time.monotonic()
        n = file.spilled_pages
        if len(lead) > n:
            raise ValueError(f"{len(lead)} lead pages for a file of {n}")
        if file.residency == HOST:
            data = file.host_data
            src = HOST
            nbytes = 0
        else:
            blob = self.store.get(store_key(file.tenant, file.name or ""))
            data = decode_data(blob)
            src, nbytes = STORE, len(blob)
        fresh = self.alloc.alloc(file.tenant, n - len(lead))
        if fresh:
            assert data is not None and data.shape[0] == n
            copied = data[len(lead) :]
            self.page_io.write_pages(fresh, copied)
            if src == HOST:
                nbytes = copied.numel() * copied.element_size()
        if moves is not None:
            moves.append(TierMove(src, nbytes, began, time.monotonic()))
        file.pages = [*lead, *fresh]
        if file.residency == HOST and file.host_data is not None:
            self.clean_pages += n
        else:
            file.host_data = None
        file.spilled_pages = 0
        file.residency = DEVICE
        log.info("event=kv_reload file=%s pages=%d copied=%d", file.path, n, len(fresh))

    def drop(self, file: KVFile) -> None:
        """Release every tier's copy (pages, host tensor); the store blob is the caller's."""
        if file.residency == DEVICE:
            self.forget_clean_copy(file)
            self.alloc.decref(file.pages)
            file.pages = []
        elif file.residency == HOST:
            self.host_used -= file.spilled_pages
            file.host_data = None
        file.spilled_pages = 0
