"""Bias vectors: vocabulary-sized logit offsets a LIP creates once (``bias_create``) and names by
handle in its choices (``bias_ref``), so a bias over half the vocabulary (a watermark's green
list) costs one round trip to set up instead of riding in every call, past the 4,096 entries a
sparse ``bias`` map may have.

Each vector is a dense float32 tensor built at creation: applying it is one tensor add per
logits row, whatever number of tokens it biases. A session holds at most
``protocol.MAX_BIAS_HANDLES`` of them and ``protocol.MAX_BIAS_BYTES`` in all (``vocab_size * 4``
bytes each); they are dropped with the session.
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Sequence

import torch

from gpu_worker.protocol import MAX_BIAS_BYTES, MAX_BIAS_HANDLES, ErrorCode, ProtocolError


def token_set_vector(vocab: int, ids: Sequence[int], value: float) -> torch.Tensor:
    """``value`` at each of ``ids`` (checked against the vocabulary by the protocol), 0 elsewhere."""
    out = torch.zeros(vocab, dtype=torch.float32)
    out[torch.tensor(list(ids), dtype=torch.long)] = float(value)
    return out


def dense_vector(values: array[float]) -> torch.Tensor:
    """A copy of ``values`` (an ``array("f")`` the protocol decoded) as a float32 tensor."""
    return torch.frombuffer(bytearray(values), dtype=torch.float32)


def apply(logits: torch.Tensor, vector: torch.Tensor | None) -> torch.Tensor:
    """``logits + vector`` as a new row (``logits`` itself without a vector)."""
    if vector is None:
        return logits
    if vector.device != logits.device or vector.dtype != logits.dtype:
        vector = vector.to(device=logits.device, dtype=logits.dtype)
    return logits + vector


class BiasStore:
    """One session's bias vectors, bounded in number and in bytes."""

    def __init__(self, max_handles: int = MAX_BIAS_HANDLES, max_bytes: int = MAX_BIAS_BYTES) -> None:
        self.max_handles = max_handles
        self.max_bytes = max_bytes
        self.bytes = 0
        self._items: dict[int, torch.Tensor] = {}
        self._ids = itertools.count(1)

    def __len__(self) -> int:
        return len(self._items)

    def add(self, vector: torch.Tensor) -> int:
        cost = vector.numel() * vector.element_size()
        if len(self._items) >= self.max_handles:
            raise ProtocolError(
                ErrorCode.NO_SPACE, f"too many bias vectors (limit {self.max_handles}); release some first"
            )
        if self.bytes + cost > self.max_bytes:
            raise ProtocolError(
                ErrorCode.NO_SPACE,
                f"bias vectors would hold {self.bytes + cost} bytes, over the session's limit of"
                f" {self.max_bytes} (vocab_size * 4 each); release some first",
            )
        hid = next(self._ids)
        self._items[hid] = vector
        self.bytes += cost
        return hid

    def get(self, hid: int) -> torch.Tensor:
        try:
            return self._items[hid]
        except KeyError:
            raise ProtocolError(ErrorCode.NOT_FOUND, f"no such bias handle {hid}") from None

    def release(self, hid: int) -> None:
        vector = self._items.pop(hid, None)
        if vector is None:
            raise ProtocolError(ErrorCode.NOT_FOUND, f"no such bias handle {hid}")
        self.bytes -= vector.numel() * vector.element_size()

    def clear(self) -> None:
        self._items.clear()
        self.bytes = 0
