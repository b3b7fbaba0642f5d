"""Dist handles: next-token distributions kept worker-side (docs/ARCHITECTURE.md §4).

A ``pred`` leaves its logits rows here and hands the LIP small integer handles; sampling,
masking and biasing run in the worker, so a reply carries a few bytes instead of a vocabulary
vector. Handles are per session, bounded in number and dropped when the session ends.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from gpu_worker.protocol import ErrorCode, ProtocolError, Sample, TopKReply


def _bad(message: str) -> ProtocolError:
    return ProtocolError(ErrorCode.BAD_ARGS, message)


@dataclass(frozen=True)
class SampleParams:
    """Validated sampling parameters; ``temperature == 0`` means greedy."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None

    @classmethod
    def of(cls, spec: Sample) -> SampleParams:
        """The parameters of a decoded ``sample`` choice (bounds checked by the protocol)."""
        return cls(float(spec.temperature), float(spec.top_p), int(spec.top_k), spec.seed)


def apply_bias(logits: torch.Tensor, bias: object) -> torch.Tensor:
    """Add a sparse ``{token_id: offset}`` bias (e.g. a watermark) to a copy of ``logits``."""
    if bias is None:
        return logits
    if not isinstance(bias, Mapping) or len(bias) > logits.shape[-1]:
        raise _bad("bias must be a map token_id -> offset")
    ids, offsets = [], []
    for key, value in bias.items():
        tid = int(key) if isinstance(key, str) and key.lstrip("-").isdigit() else key
        if not isinstance(tid, int) or isinstance(tid, bool) or not 0 <= tid < logits.shape[-1]:
            raise _bad(f"bias token id out of range: {key!r}")
        if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
            raise _bad("bias offsets must be finite numbers")
        ids.append(tid)
        offsets.append(float(value))
    out = logits.clone()
    out[torch.tensor(ids, dtype=torch.long)] += torch.tensor(offsets, dtype=out.dtype)
    return out


def allowed_mask(vocab: int, token_ids: Sequence[object]) -> np.ndarray:
    """Boolean vector of allowed tokens from an explicit list."""
    if not isinstance(token_ids, list | tuple) or not token_ids or len(token_ids) > vocab:
        raise _bad("an allowed-token mask must list between 1 and vocab_size token ids")
    if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in token_ids):
        raise _bad("mask token ids must be integers in [0, vocab_size)")
    mask = np.zeros(vocab, dtype=np.bool_)
    mask[list(token_ids)] = True
    return mask


def restrict(logits: torch.Tensor, allowed: np.ndarray | None) -> torch.Tensor:
    """A copy of a logits row with every token ``allowed`` (a bool array, one per token) does
    not mark set to -inf (``logits`` itself when there is no mask): an explicit token list
    (``allowed_mask``) or a grammar state's mask (``grammar.Matcher.restrict``).

    Grammar masks mostly allow a handful of tokens (a JSON key's next character) and sometimes
    thousands (inside a string), so a sparse mask gathers its few tokens into a row of -inf
    and a dense one is a ``where``: ~0.04 ms a 49k row on one CPU thread, against ~0.25 ms for
    xgrammar's own CPU apply (B5's gap between forwards paid that per sequence)."""
    if allowed is None:
        return logits
    if logits.dim() != 1 or logits.shape[0] != allowed.shape[0]:
        raise ValueError(f"mask of {allowed.shape[0]} tokens for logits of shape {tuple(logits.shape)}")
    if not _cpu_float(logits):
        return logits.masked_fill(~torch.from_numpy(allowed).to(logits.device), float("-inf"))
    ids = np.flatnonzero(allowed)
    if not len(ids):
        raise ProtocolError(ErrorCode.BAD_ARGS, "mask allows no token")
    row = logits.numpy()
    if len(ids) * 4 > len(row):
        return torch.from_numpy(np.where(allowed, row, row.dtype.type(-np.inf)))
    out = np.full(row.shape, -np.inf, dtype=row.dtype)
    out[ids] = row[ids]
    return torch.from_numpy(out)


def _cpu_float(t: torch.Tensor) -> bool:
    return t.device.type == "cpu" and t.dtype in (torch.float32, torch.float64) and not t.requires_grad


def argmax(logits: torch.Tensor) -> int:
    """The first maximal token (a NaN counts as maximal, as in ``torch.argmax``).

    Through NumPy for a CPU float row: its SIMD argmax takes ~8 us for a 49k vocabulary, torch's
    ~90 us on one thread. Greedy decoding runs this once per token between two forwards, so a
    forward of 32 sequences waited ~3 ms for torch's (B3's trace of the gap).
    """
    if _cpu_float(logits):
        return int(logits.numpy().argmax())
    return int(torch.argmax(logits))


def _max(logits: torch.Tensor) -> float:
    """The largest logit, NaN if any is NaN (NumPy's max: ~5 us a 49k row, torch's ~15 us)."""
    return float(logits.numpy().max()) if _cpu_float(logits) else float(logits.max())


def sample(logits: torch.Tensor, params: SampleParams, generator: torch.Generator) -> int:
    """Temperature / top-k / top-p sampling; greedy at temperature 0.

    Runs once per sampled token between two forwards, so it is kept to one reduction, one
    subtraction and one in-place exponential into unnormalised weights (``_draw`` scales its
    uniform by their total): ~0.1 ms for a 49k vocabulary on one CPU thread, against ~0.2 ms with
    a softmax and ~0.5 ms for the float64 version with two full-row finiteness checks.
    """
    if params.temperature == 0:
        return argmax(logits)
    top = _max(logits)
    if math.isnan(top):
        raise ProtocolError(ErrorCode.INTERNAL, "the model produced NaN logits")
    if top == -math.inf:
        raise _bad("mask and bias leave no token with a finite logit")
    if top == math.inf:
        # A +inf bias (legal): in the limit only the +inf tokens remain, equally likely.
        scaled = torch.zeros_like(logits, dtype=torch.float32).masked_fill(~torch.isposinf(logits), float("-inf"))
    else:
        # Shifted by the maximum before dividing: the best token scores 0 and the rest below, so
        # a tiny temperature or a huge bias underflows to probability 0 instead of overflowing
        # to inf, and the limit is the maximal tokens, equally likely.
        scaled = logits.to(torch.float32) - top  # a new tensor: the in-place ops below are safe
        if params.temperature != 1.0:
            scaled.div_(params.temperature)
    if params.top_k > 0 and params.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, params.top_k).values[-1]
        scaled.masked_fill_(scaled < kth, float("-inf"))
    if params.top_p < 1.0:
        probs = torch.softmax(scaled, dim=-1)
        sorted_probs, order = torch.sort(probs, descending=True)
        cumulative = torch.cumsum(sorted_probs, dim=-1)
        drop = cumulative - sorted_probs > params.top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        weights = torch.zeros_like(probs).scatter(0, order, sorted_probs)
    else:
        weights = scaled.exp_()  # the best token weighs 1, a masked one 0
    if params.seed is not None:
        generator = torch.Generator().manual_seed(params.seed)
    return _draw(weights, generator)


def _draw(weights: torch.Tensor, generator: torch.Generator) -> int:
    """One token by inverse CDF over non-negative ``weights`` (not necessarily summing to 1):
    one uniform draw scaled by their total, and a binary search.

    ``torch.multinomial`` on a CPU vocabulary row costs 1-13 ms (more when the engine's
    threads hold the cores), and it runs between forwards for every sampled token; this costs
    ~0.07 ms. ``right=True`` picks the first token whose cumulative mass exceeds the draw, so a
    token of weight 0 is never chosen.
    """
    cdf = torch.cumsum(weights, dim=-1, dtype=torch.float64)  # float32 sums drift over a vocabulary
    u = torch.rand((), dtype=cdf.dtype, generator=generator) * cdf[-1]
    index = int(torch.searchsorted(cdf, u, right=True))
    if index >= cdf.shape[-1]:  # u rounded up to the total mass: the last token with any
        index = int(torch.nonzero(weights).max())
    return index


def topk(logits: torch.Tensor, k: int) -> TopKReply:
    if k > logits.shape[-1]:
        raise _bad(f"k must be at most the vocabulary size ({logits.shape[-1]})")
    logprobs = torch.log_softmax(logits, dim=-1)
    values, ids = torch.topk(logprobs, k)
    return TopKReply(ids=[int(i) for i in ids], logprobs=[float(v) for v in values])


def logprob(logits: torch.Tensor, token_ids: Sequence[int]) -> list[float]:
    """Log-probabilities of ``token_ids`` (checked against the vocabulary by the protocol)."""
    logprobs = torch.log_softmax(logits, dim=-1)
    return [float(v) for v in logprobs[torch.tensor(list(token_ids), dtype=torch.long)]]


def full(logits: torch.Tensor) -> bytes:
    """All log-probs as float16 little-endian bytes (explicit opt-in: vocab_size * 2 bytes)."""
    return torch.log_softmax(logits, dim=-1).to(torch.float16).numpy().astype("<f2").tobytes()


class DistStore:
    """One session's live Dist handles (1-D float32 CPU logits), bounded in number."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._items: dict[int, torch.Tensor] = {}
        self._ids = itertools.count(1)

    def __len__(self) -> int:
        return len(self._items)

    def add_many(self, rows: Sequence[torch.Tensor]) -> list[int]:
        if len(self._items) + len(rows) > self.limit:
            raise ProtocolError(
                ErrorCode.NO_SPACE, f"too many live Dist handles (limit {self.limit}); release some first"
            )
        out = []
        for row in rows:
            hid = next(self._ids)
            self._items[hid] = row
            out.append(hid)
        return out

    def get(self, hid: object) -> torch.Tensor:
        if not isinstance(hid, int) or isinstance(hid, bool):
            raise _bad("dist must be an integer handle")
        try:
            return self._items[hid]
        except KeyError:
            raise ProtocolError(ErrorCode.NOT_FOUND, f"no such dist handle {hid}") from None

    def release(self, hids: Sequence[object]) -> None:
        for hid in hids:
            if isinstance(hid, int) and not isinstance(hid, bool):
                self._items.pop(hid, None)

    def clear(self) -> None:
        self._items.clear()
