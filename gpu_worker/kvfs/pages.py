"""Device page allocator: reference counts, a free list and per-tenant accounting.

Pages are the unit the engine reads and writes KV in. A page belongs to exactly one tenant
while allocated (forks never cross tenants), so per-tenant device usage is a plain count.
Page 0 is reserved by the engine (padding slot) and never handed out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from gpu_worker.kvfs.errors import NoSpace


class PageAllocator:
    """Ref-counted pages ``1..num_pages-1``."""

    def __init__(self, num_pages: int) -> None:
        if num_pages < 2:
            raise ValueError("need at least one usable page besides the reserved page 0")
        self.num_pages = num_pages
        self._refs = [0] * num_pages
        self._tenant: list[str | None] = [None] * num_pages
        # Pop from the end: low page ids are handed out first (easier to read in logs).
        self._free = list(range(num_pages - 1, 0, -1))
        self._per_tenant: Counter[str] = Counter()

    @property
    def free_count(self) -> int:
        return len(self._free)

    @property
    def usable(self) -> int:
        return self.num_pages - 1

    def tenant_pages(self, tenant: str) -> int:
        return self._per_tenant[tenant]

    def per_tenant(self) -> dict[str, int]:
        return {t: n for t, n in self._per_tenant.items() if n}

    def refcount(self, page: int) -> int:
        return self._refs[page]

    def owner(self, page: int) -> str | None:
        return self._tenant[page]

    def alloc(self, tenant: str, n: int) -> list[int]:
        """``n`` fresh pages with refcount 1, all or nothing."""
        if n > len(self._free):
            raise NoSpace(f"KV cache full: need {n} pages, {len(self._free)} free")
        pages = [self._free.pop() for _ in range(n)]
        for p in pages:
            self._refs[p] = 1
            self._tenant[p] = tenant
        self._per_tenant[tenant] += n
        return pages

    def incref(self, tenant: str, pages: Iterable[int]) -> None:
        for p in pages:
            if self._refs[p] <= 0:
                raise AssertionError(f"incref of free page {p}")
            if self._tenant[p] != tenant:
                raise AssertionError(f"page {p} shared across tenants")
            self._refs[p] += 1

    def decref(self, pages: Iterable[int]) -> list[int]:
        """Drop one reference from each page; returns the pages that became free."""
        freed = []
        for p in pages:
            if self._refs[p] <= 0:
                raise AssertionError(f"decref of free page {p}")
            self._refs[p] -= 1
            if self._refs[p] == 0:
                tenant = self._tenant[p]
                assert tenant is not None
                self._per_tenant[tenant] -= 1
                self._tenant[p] = None
                self._free.append(p)
                freed.append(p)
        return freed

    def check(self) -> None:
        """Assert the allocator's invariants (used by tests and debug logging)."""
        assert self._refs[0] == 0 and 0 not in self._free
        assert len(set(self._free)) == len(self._free)
        assert all(self._refs[p] == 0 for p in self._free)
        used = [p for p in range(1, self.num_pages) if self._refs[p] > 0]
        assert len(used) + len(self._free) == self.num_pages - 1
        counts = Counter(self._tenant[p] for p in used)
        assert all(counts[t] == n for t, n in self._per_tenant.items())
