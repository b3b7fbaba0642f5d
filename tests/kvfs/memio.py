"""An in-memory paged KV tensor: a real ``PageIO`` for unit tests (the Engine satisfies the same protocol)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from gpu_worker.kvfs import KVFS, AppendPlan, KVFSLimits, LocalKVStore, Owner

BLOCK = 4
PAGE_SHAPE = (2, BLOCK, 3)  # (K/V, tokens, features)


class MemPageIO:
    """``pages[i]`` holds page ``i``; token ``t`` at position ``p`` is written as value ``t*1000+p``."""

    def __init__(self, num_pages: int) -> None:
        self.pages = torch.zeros((num_pages, *PAGE_SHAPE))

    def read_pages(self, page_ids: Sequence[int]) -> torch.Tensor:
        return self.pages[list(page_ids)].clone()

    def write_pages(self, page_ids: Sequence[int], data: torch.Tensor) -> None:
        self.pages[list(page_ids)] = data

    def apply_copies(self, pairs: Sequence[tuple[int, int]]) -> None:
        """The copy-on-write page copies a forward applies before it runs (``Batch.page_copies``)."""
        for src, dst in pairs:
            self.pages[dst] = self.pages[src]

    def run(self, plan: AppendPlan) -> None:
        """Play the engine: apply COW copies, then write each run token's KV at its position."""
        self.apply_copies(plan.page_copies)
        for i, tok in enumerate(plan.run_token_ids):
            pos = plan.num_computed_tokens + i
            page = plan.page_ids[pos // BLOCK]
            self.pages[page, :, pos % BLOCK, :] = float(tok * 1000 + pos)

    def kv_of(self, fs: KVFS, owner: Owner, h: int) -> list[float]:
        """The KV values a forward would read for a file's computed tokens."""
        file = fs._handles.get(owner, h).file
        out = []
        for pos in range(file.computed):
            out.append(float(self.pages[file.pages[pos // BLOCK], 0, pos % BLOCK, 0]))
        return out


def expected_kv(tokens: Sequence[int]) -> list[float]:
    return [float(t * 1000 + p) for p, t in enumerate(tokens)]


def make_fs(
    tmp_path: Path, num_pages: int = 32, host_pages: int = 8, prefix_cache: bool = False, **limits: float
) -> tuple[KVFS, MemPageIO]:
    io = MemPageIO(num_pages)
    fs = KVFS(
        num_pages=num_pages,
        block_size=BLOCK,
        page_bytes=int(torch.zeros(PAGE_SHAPE).nbytes),
        page_io=io,
        store=LocalKVStore(tmp_path / "kvstore"),
        host_pages=host_pages,
        limits=KVFSLimits(**limits),
        prefix_cache=prefix_cache,
    )
    return fs, io


def append(fs: KVFS, io: MemPageIO, owner: Owner, h: int, tokens: Sequence[int]) -> AppendPlan:
    plan = fs.plan_append(owner, h, tokens)
    io.run(plan)
    fs.commit_append(plan)
    return plan


def stored_blobs(store, prefix: str = "") -> list[str]:
    """The store's KV file blobs (leases beside them left out: gpu_worker/kvfs/lease.py)."""
    return sorted(k for k in store.list(prefix) if k.endswith(".safetensors"))
