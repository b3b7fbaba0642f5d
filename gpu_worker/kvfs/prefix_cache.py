"""The prefix index as KV files use it: keying a file's full pages, indexing them, mapping them.

``PrefixIndex`` (gpu_worker/kvfs/prefix.py) is a map of chained page keys to pages. This module
is what KVFS does with it: extend a file's key chain over its newly full pages and index them
after an append or a reload, find the cached pages a new file or a reloading file can start
from, and reclaim cached-only pages when pages are short. With the cache off (``index`` is
``None``) every question answers "nothing cached", so callers need no check of their own.
It takes no lock: the ``KVFS`` facade holds its lock around every call.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from gpu_worker.kvfs.files import DEVICE, KVFile
from gpu_worker.kvfs.pages import PageAllocator
from gpu_worker.kvfs.prefix import PrefixIndex, chain_key


class PrefixCache:
    """A tenant-scoped prefix index over whole pages of ``block_size`` tokens (or none)."""

    def __init__(self, alloc: PageAllocator, block_size: int, enabled: bool) -> None:
        self.alloc = alloc
        self.block_size = block_size
        self.index: PrefixIndex | None = PrefixIndex(alloc) if enabled else None

    def extend_chain(self, file: KVFile) -> int:
        """Key the file's full computed pages it has no key for yet; returns how many are full."""
        bs = self.block_size
        full = file.computed // bs
        while len(file.chain) < full:
            i = len(file.chain)
            file.chain.append(chain_key(file.chain[-1] if i else b"", file.tokens[i * bs : (i + 1) * bs]))
        return full

    def register_full_pages(self, file: KVFile) -> None:
        """Index the file's pages that became full (their tokens are final) under their chained
        keys. Only device-resident, cache-enabled files with the cache on; O(new full pages)."""
        if self.index is None or not file.cache or file.residency != DEVICE:
            return
        full = self.extend_chain(file)
        for i in range(file.registered, full):
            self.index.register(file.tenant, file.chain[i], file.pages[i])
        file.registered = full

    def match(self, tenant: str, tokens: Sequence[int], limit: int) -> tuple[list[int], list[bytes]]:
        """The cached pages of the longest whole-page prefix of ``tokens`` (at most ``limit``
        tokens, and never the last token, whose logits the caller must compute) with their keys.
        No reference is taken. Keys are hashed lazily: a miss on page 1 hashes one page only.
        ``OverflowError``, ``TypeError`` or ``ValueError`` when ``tokens`` are not token ids."""
        if self.index is None:
            return [], []
        bs = self.block_size
        n_pages = max(0, min(limit, len(tokens) - 1)) // bs
        keys: list[bytes] = []

        def chained() -> Iterator[bytes]:
            for i in range(n_pages):
                keys.append(chain_key(keys[-1] if i else b"", tokens[i * bs : (i + 1) * bs]))
                yield keys[-1]

        pages = self.index.lookup(tenant, chained())
        return pages, keys[: len(pages)]

    def cached_lead(self, file: KVFile) -> list[int]:
        """The cached pages for a spilled file's first full pages (the longest run from the
        first), each with a reference taken for the caller so that making room for the rest
        cannot reclaim them."""
        if self.index is None or not file.cache:
            return []
        full = min(self.extend_chain(file), file.spilled_pages)
        pages = self.index.lookup(file.tenant, file.chain[:full])
        self.alloc.incref(file.tenant, pages)
        return pages

    def reclaim(self, n: int, tenant: str | None = None) -> int:
        """Free up to ``n`` cached-only pages (of ``tenant``, or anyone's); how many were."""
        return 0 if self.index is None or n <= 0 else self.index.reclaim(n, tenant)

    def cached_only(self, tenant: str | None = None) -> int:
        """Pages only the index holds (of ``tenant``, or everyone's)."""
        return 0 if self.index is None else self.index.cached_only(tenant)

    def indexed(self) -> int:
        return 0 if self.index is None else len(self.index)

    def pages(self) -> list[int]:
        """Every page the index holds a reference to (once per entry)."""
        return [] if self.index is None else list(self.index.pages())

    def drop_tenant(self, tenant: str) -> None:
        if self.index is not None:
            self.index.drop_tenant(tenant)
