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
