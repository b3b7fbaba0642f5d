"""What passes from the batch scheduler to the engine adapter, and nothing else.

Modelled on vLLM's ``SchedulerOutput``: the scheduler (with KVFS) decides which tokens run and
which KV pages they read and write; the engine executes exactly that. The engine never sees
tenants, sessions or KV file names; KVFS never sees activation tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SeqWork:
    """One ``pred`` call's share of a forward pass.

    ``seq_id`` identifies the KV file handle being extended; the engine may cache per-sequence
    state under it (vLLM's persistent request), but every ``SeqWork`` fully describes the
    sequence, so a changed ``num_computed_tokens`` or page table (after truncate, fork, reload)
    must be honoured, never answered from a stale cache.
    """

    seq_id: str
    #: Token ids appended by this call; their positions are
    #: ``num_computed_tokens .. num_computed_tokens + len(new_token_ids) - 1``.
    new_token_ids: tuple[int, ...]
    #: Tokens already in the KV pages of this sequence (read, not recomputed).
    num_computed_tokens: int
    #: Block table: page ids covering all ``num_computed_tokens + len(new_token_ids)`` tokens,
    #: chosen by KVFS. Page 0 is never handed out.
    page_ids: tuple[int, ...]
    #: Offsets into ``new_token_ids`` whose next-token logits are returned (default: the last).
    logits_rows: tuple[int, ...]


@dataclass(frozen=True)
class Batch:
    """A forward pass over several sequences (continuous batching)."""

    items: tuple[SeqWork, ...]
    #: ``(src_page, dst_page)`` copies to perform *before* the forward: copy-on-write of a
    #: partial last page shared by forked files.
    page_copies: tuple[tuple[int, int], ...] = field(default_factory=tuple)

    @property
    def num_tokens(self) -> int:
        return sum(len(item.new_token_ids) for item in self.items)
