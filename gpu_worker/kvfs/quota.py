"""A tenant's share of each KV tier, as its plan sets it.

Shares of the device pool and of host memory are *fractions* of the tier's capacity, not page
counts: one plan then means the same on a worker with a 1 GiB pool and on one with 40 GiB, and the
control plane need not know each worker's size. The worker turns them into pages (rounded down).

What each share bounds:

* ``pinned_device_share``: pages of the tenant's *pinned* named files, wherever they are now (a
  pinned file is never spilled by policy, so it is the part of the device pool nobody else can
  get back). Pinning or growing a pinned file past it fails with ``EDQUOT``. Unpinned named files
  need no device share: they are spilled, least recently used first and of any tenant, before any
  request for pages is refused.
* ``host_share``: host-memory pages of the tenant's spilled named files (and clean copies). Past
  it, the tenant's own oldest host files move to disk, so its spills never push another
  tenant's files out of host memory.
* ``stored_bytes``: bytes of all its named files (the disk tier and the store).
* ``max_files``: how many named files it may have; creating one more fails with ``EDQUOT``.

``None`` leaves that bound to the worker default (``KVFSLimits``), unlimited unless configured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T", int, float)


@dataclass(frozen=True)
class TenantQuota:
    """One tenant's bounds on its named (persistent) KV files; ``None`` = the worker default."""

    stored_bytes: int | None = None
    pinned_device_share: float | None = None
    host_share: float | None = None
    max_files: int | None = None

    def __post_init__(self) -> None:
        for share in (self.pinned_device_share, self.host_share):
            if share is not None and not 0.0 <= share <= 1.0:
                raise ValueError("a tier share must be a fraction in [0, 1]")
        for count in (self.stored_bytes, self.max_files):
            if count is not None and count < 0:
                raise ValueError("a byte or file bound must not be negative")

    def or_default(self, default: TenantQuota) -> TenantQuota:
        """Each unset field taken from ``default``."""
        return TenantQuota(
            stored_bytes=_first(self.stored_bytes, default.stored_bytes),
            pinned_device_share=_first(self.pinned_device_share, default.pinned_device_share),
            host_share=_first(self.host_share, default.host_share),
            max_files=_first(self.max_files, default.max_files),
        )


def share_pages(share: float | None, capacity: int) -> int | None:
    """The pages a share of a tier of ``capacity`` pages allows (rounded down), ``None`` = no bound."""
    return None if share is None else math.floor(share * capacity + 1e-9)


def _first(value: T | None, default: T | None) -> T | None:
    return default if value is None else value
