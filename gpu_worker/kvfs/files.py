"""KV files, name validation and per-session handles.

A KV file is token ids, how many of them have valid KV in its pages (``computed``), and a page
table covering exactly those computed tokens. Tokens beyond ``computed`` are *pending*: their KV
is recomputed by the next append. Handles are random 63-bit ids checked against the owner, so a
forged id from another session answers exactly like an unknown one (ENOENT).
"""

from __future__ import annotations

import itertools
import re
import secrets
import threading
import time
from dataclasses import dataclass, field

import torch

from gpu_worker.kvfs.errors import InvalidArgument, NotFound

NAME_MAX = 128
#: Matched with ``fullmatch``: a ``$`` anchor also matches before a trailing newline, which
#: would let ``"doc\n"`` through as a name (and into the store key built from it).
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_TENANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")

DEVICE, HOST, DISK = "device", "host", "disk"


@dataclass(frozen=True)
class Owner:
    """Who holds a handle: a session of a tenant."""

    tenant: str
    session: str


def validate_name(name: object) -> str:
    """A file name inside a tenant namespace: one path component, no dot-tricks."""
    if not isinstance(name, str) or not name:
        raise InvalidArgument("KV file name must be a non-empty string")
    if len(name) > NAME_MAX:
        raise InvalidArgument(f"KV file name longer than {NAME_MAX} characters")
    if ".." in name or not _NAME.fullmatch(name):
        raise InvalidArgument(
            "KV file name may contain only letters, digits, '.', '_' and '-', "
            "must start with a letter or digit and must not contain '..'"
        )
    return name


def validate_tenant(tenant: object) -> str:
    if not isinstance(tenant, str) or not _TENANT.fullmatch(tenant):
        raise InvalidArgument("invalid tenant id")
    return tenant


#: Every KV store key is ``<tenant>/<name>`` plus this.
STORE_SUFFIX = ".safetensors"


def store_key(tenant: str, name: str) -> str:
    return f"{validate_tenant(tenant)}/{validate_name(name)}{STORE_SUFFIX}"


def pages_for(n_tokens: int, block_size: int) -> int:
    return -(-n_tokens // block_size)


_counter = itertools.count(1)


def _fid() -> int:
    return next(_counter)


@dataclass(eq=False)
class KVFile:
    """One KV file; named files are persistent in ``/<tenant>/<name>``."""

    tenant: str
    name: str | None = None
    tokens: list[int] = field(default_factory=list)
    computed: int = 0
    pages: list[int] = field(default_factory=list)
    pinned: bool = False
    last_used: float = field(default_factory=time.time)
    #: Logical clock of the last use: LRU order without ties between equal wall-clock times.
    use_seq: int = field(default_factory=_fid)
    residency: str = DEVICE
    #: KV of the computed tokens while spilled to host memory: ``[n_pages, *page_shape]``.
    host_data: torch.Tensor | None = None
    #: Number of pages the spilled copy holds (host or disk residency).
    spilled_pages: int = 0
    handles: set[int] = field(default_factory=set)
    writer: int | None = None
    plan_pending: bool = False
    #: A named file changed since it was last written to the store (written on last close).
    dirty: bool = False
    #: The store generation this copy is (gpu_worker/kvfs/lease.py); readers compare it with
    #: the lease's to know whether a cached copy is still the latest flushed one.
    generation: int = 0
    #: The store holds this copy's content (as generation ``generation``).
    stored: bool = False
    #: Bumped with every change of content (:meth:`changed`): a store write made outside the
    #: KVFS lock marks the file clean only if nothing changed since its snapshot.
    version: int = 0
    #: The newest generation this worker has put in the store, and the lock its writes take:
    #: a write made outside the KVFS lock skips itself when a newer one got there first, and
    #: an unlink sets it past any generation so an in-flight write cannot bring the blob back.
    written_generation: int = 0
    write_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    #: Take part in the prefix cache (gpu_worker/kvfs/prefix.py): ``kv_create(cache=False)`` opts out.
    cache: bool = True
    #: Written through to the store at its last close (a worker crash loses no closed file).
    #: ``kv_create(durable=False)``: written when it is idle (``KVFS.lazy_write_s``), leaves host
    #: memory for the disk tier, or the worker flushes; a crash may lose its unwritten changes.
    durable: bool = True
    #: Chained prefix-cache keys of the first full computed pages (``len(chain) <= computed // block``).
    chain: list[bytes] = field(default_factory=list)
    #: How many of the first full pages are known to be in the prefix index.
    registered: int = 0
    fid: int = field(default_factory=_fid)

    @property
    def persistent(self) -> bool:
        return self.name is not None

    @property
    def path(self) -> str:
        return f"/{self.tenant}/{self.name}" if self.name else f"/{self.tenant}/#anon{self.fid}"

    @property
    def seq_id(self) -> str:
        return f"kv{self.fid}"

    @property
    def n_pages(self) -> int:
        return len(self.pages) if self.residency == DEVICE else self.spilled_pages

    def changed(self) -> None:
        """Its content changed: a named file must be written to the store again."""
        self.dirty = self.persistent
        self.version += 1

    def touch(self) -> None:
        self.last_used = time.time()
        self.use_seq = next(_counter)


@dataclass(eq=False)
class Handle:
    hid: int
    owner: Owner
    file: KVFile


class HandleTable:
    """Random handle ids -> handles, checked against the owner."""

    def __init__(self) -> None:
        self._handles: dict[int, Handle] = {}

    def __len__(self) -> int:
        return len(self._handles)

    def add(self, owner: Owner, file: KVFile) -> Handle:
        hid = secrets.randbits(62) + 1
        while hid in self._handles:
            hid = secrets.randbits(62) + 1
        handle = Handle(hid, owner, file)
        self._handles[hid] = handle
        file.handles.add(hid)
        return handle

    def get(self, owner: Owner, hid: object) -> Handle:
        if not isinstance(hid, int) or isinstance(hid, bool):
            raise InvalidArgument("KV handle must be an integer")
        handle = self._handles.get(hid)
        if handle is None or handle.owner != owner:
            raise NotFound(f"no KV handle {hid} in this session")
        return handle

    def pop(self, hid: int) -> Handle:
        handle = self._handles.pop(hid)
        handle.file.handles.discard(hid)
        return handle

    def owner_of(self, hid: int) -> Owner:
        return self._handles[hid].owner

    def all(self) -> list[Handle]:
        return list(self._handles.values())

    def of_session(self, owner: Owner) -> list[Handle]:
        return [h for h in self._handles.values() if h.owner == owner]
