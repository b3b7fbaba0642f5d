"""Handles and names: which KV files exist on this worker and who has them open.

The catalogue is the two tables every other part of KVFS reads: named files by
``(tenant, name)`` and open handles by id (``HandleTable``). It answers the questions asked of
them (a session's files, a tenant's pinned or stored pages, the idle files that may be
spilled) and caps how many handles one session may hold. It decides nothing about tiers,
leases or budgets, and takes no lock: the ``KVFS`` facade holds its lock around every call.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from gpu_worker.kvfs.errors import NoSpace
from gpu_worker.kvfs.files import DEVICE, HOST, Handle, HandleTable, KVFile, Owner, validate_tenant


class Catalogue:
    """Named files and open handles, with the queries the rest of KVFS makes of them."""

    def __init__(self, max_handles_per_session: int) -> None:
        self.max_handles_per_session = max_handles_per_session
        self.named: dict[tuple[str, str], KVFile] = {}
        self.handles = HandleTable()

    # --------------------------------------------------------------------- handles
    def new_handle(self, owner: Owner, file: KVFile) -> int:
        """Open ``file`` for ``owner``; ENOSPC past the per-session handle cap."""
        validate_tenant(owner.tenant)
        if len(self.handles.of_session(owner)) >= self.max_handles_per_session:
            raise NoSpace(f"too many open KV handles (limit {self.max_handles_per_session})")
        file.touch()
        return self.handles.add(owner, file).hid

    def session_handles(self, owner: Owner) -> list[Handle]:
        return self.handles.of_session(owner)

    def session_files(self, owner: Owner) -> list[KVFile]:
        """The session's open files, each once, in the order its handles were opened: swapping
        moves files one at a time against tier capacities, so the order decides which fit, and
        it must not be a set's (object addresses) for the outcome to be reproducible."""
        return list(dict.fromkeys(h.file for h in self.handles.of_session(owner)))

    def held(self, owner: Owner) -> tuple[set[int], int]:
        """The distinct pages and the tokens of the session's open files."""
        pages: set[int] = set()
        tokens = 0
        for handle in self.handles.of_session(owner):
            pages.update(handle.file.pages)
            tokens += len(handle.file.tokens)
        return pages, tokens

    def live_files(self) -> list[KVFile]:
        """Every file this worker knows: open ones (anonymous included) and named ones, each once."""
        files = {id(h.file): h.file for h in self.handles.all()}
        files.update({id(f): f for f in self.named.values()})
        return list(files.values())

    # ----------------------------------------------------------------------- names
    def of_tenant(self, tenant: str) -> list[KVFile]:
        return [f for (t, _), f in self.named.items() if t == tenant]

    def file_count(self, tenant: str) -> int:
        return sum(1 for (t, _) in self.named if t == tenant)

    def stored_pages(self, tenant: str | None) -> int:
        """Pages of all the tenant's (``None``: everyone's) named files, on whichever tier."""
        return sum(f.n_pages for (t, _), f in self.named.items() if tenant in (None, t))

    def pinned_pages(self, tenant: str | None) -> int:
        """Pages of the tenant's (``None``: everyone's) pinned named files, on whichever tier."""
        return sum(f.n_pages for (t, _), f in self.named.items() if f.pinned and tenant in (None, t))

    def evictable(self, tenant: str | None = None, tenants: Sequence[str] | None = None) -> list[KVFile]:
        """Idle, unpinned, device-resident named files (of ``tenant`` / ``tenants`` where
        given), least recently used first."""
        files = [
            f
            for f in self.named.values()
            if f.residency == DEVICE
            and f.pages
            and not f.pinned
            and not f.handles
            and not f.plan_pending
            and (tenant is None or f.tenant == tenant)
            and (tenants is None or f.tenant in tenants)
        ]
        return sorted(files, key=lambda f: f.use_seq)

    def idle_on_host(self) -> list[KVFile]:
        """Named files spilled to host memory that no handle uses, least recently used first."""
        return sorted(
            (f for f in self.named.values() if f.residency == HOST and not f.handles), key=lambda f: f.use_seq
        )

    def __iter__(self) -> Iterator[KVFile]:
        return iter(list(self.named.values()))
