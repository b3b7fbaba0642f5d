"""One writer per named KV file across workers: a lease with a generation number in the store.

Workers sharing a KV store (a directory on shared storage, or S3) each cache named files in
their own device and host memory. Without coordination two of them could each hold a copy, each
write through its own, and the last to flush would silently win. The lease settles it:

- ``<tenant>/<name>.lease`` (JSON, next to the blob) holds ``generation`` (how many times the
  file was flushed), ``owner`` (the worker holding the write lease, or none) and ``expires``
  (wall-clock seconds; an owner that stopped renewing, i.e. a dead worker, holds nothing).
- Every change to a lease is a conditional write (:meth:`KVStore.put_if`), so two workers
  cannot both take it.
- A worker opens a file for writing (``kv_create(name)``, ``kv_open(name, "w")``) only after
  taking the lease, renews it while the file has unflushed changes, and on the last close bumps
  the generation, writes the blob (which records the generation too) and gives the lease back
  (after the blob is in; the write itself runs outside the KVFS lock, and one that lands after a
  newer generation's is skipped).
- Any worker opening a named file compares its cached copy's generation with the lease's and
  reloads from the store when they differ, so it serves the latest flushed generation and never
  a stale one; a file whose lease and blob are gone was deleted elsewhere.

The generation is bumped *before* the blob is written: a worker dying between the two leaves a
lease one ahead of the blob, which makes readers reload (the last complete blob) rather than
trust a cache. Why a store-side lease and not the control plane's KV file table: the workers
never talk to PostgreSQL (gpu_worker never imports Django), and the store is the one thing every
worker sharing files already reaches; the control plane reads the same leases through the
workers' ``kv_list``.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from gpu_worker.kvfs.errors import Busy, Exists, KVFSError, NotFound, StoreFull
from gpu_worker.kvfs.files import validate_name, validate_tenant
from gpu_worker.kvfs.store import Conflict, KVStore

log = logging.getLogger(__name__)

LEASE_SUFFIX = ".lease"
#: Seconds a write lease lasts unless renewed; the worker renews every ``ttl / 3``, so a worker
#: that died holds a file for at most this long.
DEFAULT_LEASE_TTL_S = 30.0
#: Compare-and-swap rounds before a contended lease update gives up (EBUSY).
CAS_ATTEMPTS = 8


class StoreUnavailable(KVFSError):
    """The KV store could not be read or written: nothing is served that it cannot vouch for
    (a LIP reads ``EIO``: gpu_worker/ops/errors.py)."""


class LeaseLost(KVFSError):
    """This worker's write lease was taken over (it expired) or the file was deleted meanwhile
    (``EIO`` to a LIP)."""


def lease_key(tenant: str, name: str) -> str:
    return f"{validate_tenant(tenant)}/{validate_name(name)}{LEASE_SUFFIX}"


def default_worker_id() -> str:
    """Unique per process: two KVFS instances never mistake each other's leases for their own."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


@dataclass(frozen=True)
class Lease:
    generation: int = 0
    owner: str | None = None
    expires: float = 0.0

    def held_by_other(self, me: str, now: float) -> bool:
        return self.owner is not None and self.owner != me and self.expires > now

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> Lease:
        raw = json.loads(data)
        return cls(int(raw.get("generation", 0)), raw.get("owner") or None, float(raw.get("expires", 0.0)))


class Leases:
    """The leases of one worker (``worker_id``) over a shared store."""

    def __init__(
        self,
        store: KVStore,
        worker_id: str | None = None,
        ttl_s: float = DEFAULT_LEASE_TTL_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.worker_id = worker_id or default_worker_id()
        self.ttl_s = ttl_s
        self.clock = clock

    def _read(self, key: str) -> tuple[Lease | None, str | None]:
        try:
            data, token = self.store.get_versioned(key)
        except KeyError:
            return None, None
        except Exception as exc:
            raise StoreUnavailable(f"the KV store is unreachable: {type(exc).__name__}: {exc}") from exc
        return Lease.decode(data), token

    def read(self, tenant: str, name: str) -> Lease | None:
        return self._read(lease_key(tenant, name))[0]

    def _update(self, tenant: str, name: str, change: Callable[[Lease | None, float], Lease]) -> Lease:
        """Read, ``change`` (which may raise to refuse), conditionally write; retried on races."""
        key = lease_key(tenant, name)
        for _ in range(CAS_ATTEMPTS):
            current, token = self._read(key)
            now = self.clock()
            new = change(current, now)
            try:
                self.store.put_if(key, new.encode(), token)
            except Conflict:
                continue
            except StoreFull:
                raise  # ENOSPC, "the KV store is full": clear as it is
            except Exception as exc:
                raise StoreUnavailable(f"the KV store is unreachable: {type(exc).__name__}: {exc}") from exc
            return new
        raise Busy(f"KV file {name!r} is being changed by another worker; retry")

    def acquire(self, tenant: str, name: str, *, create: bool = False) -> Lease:
        """Take the write lease (EBUSY naming the holder when a live worker has it). ``create``:
        the file must not exist yet (no lease, or one for a file deleted since)."""

        def take(current: Lease | None, now: float) -> Lease:
            if current is None:
                return Lease(0, self.worker_id, now + self.ttl_s)
            taken = current.held_by_other(self.worker_id, now)
            if create and (current.generation > 0 or taken):
                raise Exists(f"KV file {name!r} already exists")
            if taken:
                raise Busy(f"KV file {name!r} is open for writing on worker {current.owner!r}")
            return Lease(current.generation, self.worker_id, now + self.ttl_s)

        return self._update(tenant, name, take)

    def _mine(self, name: str, current: Lease | None) -> Lease:
        if current is None:
            raise LeaseLost(f"KV file {name!r} was deleted by another worker while open here")
        if current.owner != self.worker_id:
            holder = f"worker {current.owner!r}" if current.owner else "nobody"
            raise LeaseLost(f"this worker's write lease on KV file {name!r} expired; it is now held by {holder}")
        return current

    def renew(self, tenant: str, name: str) -> Lease:
        def extend(current: Lease | None, now: float) -> Lease:
            lease = self._mine(name, current)
            return Lease(lease.generation, self.worker_id, now + self.ttl_s)

        return self._update(tenant, name, extend)

    def bump(self, tenant: str, name: str) -> int:
        """The next generation, reserved before its blob is written; the lease must be ours."""

        def next_generation(current: Lease | None, now: float) -> Lease:
            lease = self._mine(name, current)
            return Lease(lease.generation + 1, self.worker_id, now + self.ttl_s)

        return self._update(tenant, name, next_generation).generation

    def release(self, tenant: str, name: str) -> None:
        """Give the write lease back (the generation stays); a lease not ours is left alone."""

        def give_back(current: Lease | None, now: float) -> Lease:
            lease = self._mine(name, current)
            return Lease(lease.generation, None, 0.0)

        try:
            self._update(tenant, name, give_back)
        except (LeaseLost, NotFound):
            pass

    def delete(self, tenant: str, name: str) -> None:
        try:
            self.store.delete(lease_key(tenant, name))
        except Exception as exc:
            raise StoreUnavailable(f"the KV store is unreachable: {type(exc).__name__}: {exc}") from exc
