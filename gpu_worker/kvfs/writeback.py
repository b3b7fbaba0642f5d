"""Writing closed named files through to the store, now or once idle (lazy writes).

A named file whose last handle closes with changes is written to the store as its next
generation, so a worker crash loses no closed file. The write is two-phase so the KVFS lock is
not held through it: :meth:`WriteBack.begin` (lock held) reserves the generation under the
lease and snapshots pages and metadata; :meth:`WriteBack.write` (lock not held) encodes and
stores the snapshot, then takes the lock again to mark the file clean and give its lease back,
unless it changed or was written again meanwhile. A ``durable=False`` file is not written at
its close but once it has been idle a while (:meth:`WriteBack.due`), so a conversation's next
turn finds its KV where the last one left it and no turn pays for writing it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from gpu_worker.kvfs.catalogue import Catalogue
from gpu_worker.kvfs.coherence import Coherence
from gpu_worker.kvfs.files import DISK, KVFile
from gpu_worker.kvfs.lease import LeaseLost
from gpu_worker.kvfs.store import KVStore
from gpu_worker.kvfs.tiers import Tiers, encode_blob, encode_meta, put_generation

log = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class Flush:
    """A closed named file's write-through, snapshotted under the lock, written without it."""

    file: KVFile
    generation: int
    version: int
    data: torch.Tensor
    meta: dict[str, str]


class WriteBack:
    """Write-through of closed named files, in two phases around the KVFS lock."""

    def __init__(
        self, lock: threading.RLock, store: KVStore, coherence: Coherence, catalogue: Catalogue, tiers: Tiers
    ) -> None:
        """``lock`` is the KVFS lock, taken again to mark a written file clean."""
        self._lock = lock
        self.store = store
        self.coherence = coherence
        self.catalogue = catalogue
        self.tiers = tiers

    def begin(self, file: KVFile) -> Flush | None:
        """The write-through of a named file whose last handle closed, so a worker crash loses
        no closed file (lock held): reserve its next generation under the lease and snapshot
        its pages and metadata. Encoding the blob and the store's write and ``fsync`` (~100 ms for
        an 8-page float32 file of the 135M model on the benchmark host's disk) happen in
        :meth:`write` without the lock, which the engine thread takes to plan every
        forward: held through the write, each closing conversation stalled every other session.
        A lease lost meanwhile (it expired and another worker took the file, or the file was
        deleted elsewhere) means this copy must not be written over the newer one: it is
        unlinked here and the conflict logged. A store that fails is logged; the file stays
        dirty (written at the next close or at shutdown) and the lease stays held meanwhile."""
        try:
            file.generation = self.coherence.bump(file)
        except LeaseLost as exc:
            log.error("event=kv_write_conflict file=%s error=%s", file.path, exc.message)
            self.coherence.lost(file)
            return None
        except Exception as exc:
            log.warning("event=kv_write_through_failed file=%s error=%r", file.path, exc)
            return None
        data = self.tiers.host_data_of(file)  # a copy of device pages; a host copy is never mutated
        return Flush(file, file.generation, file.version, data, encode_meta(file, data.shape[0]))

    def write(self, flushes: Sequence[Flush]) -> None:
        """Write snapshots taken by :meth:`begin`, then (lock held again) mark each file
        clean and give its lease back, unless it changed, was written again or was reopened for
        writing meanwhile. Called without the lock held (with it, when nested, still correct)."""
        for flush in flushes:
            file = flush.file
            try:
                put_generation(self.store, file, flush.generation, encode_blob(flush.data, flush.meta))
            except Exception as exc:
                log.warning("event=kv_write_through_failed file=%s error=%r", file.path, exc)
                continue
            with self._lock:
                if file.generation != flush.generation or file.version != flush.version:
                    continue  # changed since: the newer write (or the next close) flushes it
                file.stored, file.dirty = True, False
                if file.writer is None and self.catalogue.named.get((file.tenant, file.name or "")) is file:
                    self.coherence.release(file)

    def due(self, now: float, idle_s: float, limit: int) -> list[Flush]:
        """Begin the writes of the closed ``durable=False`` files whose changes have waited
        ``idle_s`` since their last close, at most ``limit`` of them, the longest idle first
        (lock held)."""
        due = sorted(
            (
                f
                for f in self.catalogue.named.values()
                if not f.durable
                and f.dirty
                and not f.handles
                and not f.plan_pending
                and f.residency != DISK
                and now - f.last_used >= idle_s
            ),
            key=lambda f: f.last_used,
        )
        flushes = [self.begin(f) for f in due[:limit]]
        return [f for f in flushes if f is not None]
