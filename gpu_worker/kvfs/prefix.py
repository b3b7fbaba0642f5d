"""The automatic prefix cache: full KV pages, content-addressed per tenant, with an LRU.

Why: a chat or agent loop re-sends a long system prompt and a growing history on every turn,
and a LIP that creates a fresh KV file per request would recompute it each time. A page whose
tokens are final (it is full) has KV determined by *all* tokens up to and including it (same
model, positions from 0), so its key is a hash chained page by page over the token ids:
``key_i = H(key_{i-1} || tokens of page i)``. Equal keys mean equal prefixes, so a hit is
always the right KV whatever truncates or rewrites happened to the file that computed it.

Keys are scoped by tenant and a page is only ever mapped into files of the tenant that computed
it: a cache shared across tenants would be a timing side channel (one tenant could learn
whether another recently sent a given prompt).

The index holds one page reference per entry (``PageAllocator.incref``), exactly like a fork
does, so the engine's copy-on-write keeps a cached page intact: a file that truncates into one
and appends finds it shared and writes into a copy. A page only the index references is
*cached-only*: it belongs to no file and is reclaimed, least recently used first, before any
file is spilled or any request for pages refused (``KVFS._reserve``).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence

from gpu_worker.kvfs.pages import PageAllocator

#: Bytes of a chained page key (BLAKE2b-128: collisions are not a practical concern).
KEY_BYTES = 16


def chain_key(prev: bytes, tokens: Sequence[int]) -> bytes:
    """The key of a full page: the previous page's key (``b""`` for the first) and its tokens."""
    h = hashlib.blake2b(prev, digest_size=KEY_BYTES)
    h.update(b"".join(int(t).to_bytes(4, "little") for t in tokens))
    return h.digest()


class PrefixIndex:
    """``(tenant, key) -> page`` in LRU order (oldest first), each entry holding one reference."""

    def __init__(self, alloc: PageAllocator) -> None:
        self.alloc = alloc
        self._entries: OrderedDict[tuple[str, bytes], int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def pages(self) -> Iterator[int]:
        return iter(self._entries.values())

    def register(self, tenant: str, key: bytes, page: int) -> bool:
        """Index ``page`` (a full page of a ``tenant`` file) under ``key``; an existing entry for
        the same key is kept (it holds the same KV) and only refreshed. Whether it was added."""
        entry = (tenant, key)
        if entry in self._entries:
            self._entries.move_to_end(entry)
            return False
        self.alloc.incref(tenant, [page])
        self._entries[entry] = page
        return True

    def lookup(self, tenant: str, keys: Iterable[bytes]) -> list[int]:
        """The pages of the longest run of ``keys`` (from the first) cached for ``tenant``,
        refreshed in the LRU. The caller takes its own references to use them."""
        pages = []
        for key in keys:
            page = self._entries.get((tenant, key))
            if page is None:
                break
            self._entries.move_to_end((tenant, key))
            pages.append(page)
        return pages

    def cached_only(self, tenant: str | None = None) -> int:
        """Entries no file references (reclaimable), of ``tenant`` or of everyone."""
        return sum(
            1
            for (t, _), page in self._entries.items()
            if self.alloc.refcount(page) == 1 and (tenant is None or t == tenant)
        )

    def reclaim(self, n: int, tenant: str | None = None) -> int:
        """Free up to ``n`` cached-only pages (of ``tenant``, or of anyone), least recently used
        first; returns how many were freed. Entries a file still uses stay (freeing their
        reference would free no page)."""
        victims: list[tuple[str, bytes]] = []
        for entry, page in self._entries.items():
            if len(victims) >= n:
                break
            if self.alloc.refcount(page) == 1 and (tenant is None or entry[0] == tenant):
                victims.append(entry)
        for entry in victims:
            self.alloc.decref([self._entries.pop(entry)])
        return len(victims)

    def drop_tenant(self, tenant: str) -> int:
        """Forget every entry of ``tenant`` (its data is being removed); returns how many."""
        entries = [e for e in self._entries if e[0] == tenant]
        for entry in entries:
            self.alloc.decref([self._entries.pop(entry)])
        return len(entries)
