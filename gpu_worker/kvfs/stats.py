"""Read-only views of KVFS state for the admin API, live ``kv`` events and tests."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class KVFileInfo:
    """One row of ``kv_list``: a persistent (named) KV file."""

    tenant: str
    name: str
    tokens: int
    bytes: int
    residency: str  # "device" | "host" | "disk"
    pinned: bool
    last_used: float  # unix time
    #: The store generation this worker's copy is (gpu_worker/kvfs/lease.py).
    generation: int = 0
    #: This worker holds the file's write lease (open for writing here, or changes not flushed).
    leased: bool = False


@dataclass(frozen=True)
class KVStats:
    """Page pool and tier usage."""

    total_pages: int
    free_pages: int
    used_pages: int
    pages_per_tenant: dict[str, int] = field(default_factory=dict)
    host_pages: int = 0
    #: The part of ``host_pages`` that is clean copies of device-resident files (free to drop).
    host_clean_pages: int = 0
    host_capacity_pages: int = 0
    disk_pages: int = 0
    files: int = 0
    open_handles: int = 0
    #: Pages only the prefix cache holds (no file uses them; reclaimed before anything else).
    prefix_cached_pages: int = 0
    #: Pages in the prefix index, whether a file also uses them or not.
    prefix_indexed_pages: int = 0
