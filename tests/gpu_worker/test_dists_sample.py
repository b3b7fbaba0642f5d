"""The worker's token sampler: right distribution, never a zero-probability token, seeded."""

from __future__ import annotations

import collections

import pytest
import torch

from gpu_worker.dists import SampleParams, argmax, sample
from gpu_worker.protocol import ErrorCode, ProtocolError


def _logits(probs: list[float]) -> torch.Tensor:
    return torch.tensor([float("-inf") if p == 0 else float(torch.log(torch.tensor(p))) for p in probs])


def test_frequencies_follow_the_distribution() -> None:
    probs = [0.5, 0.0, 0.3, 0.2, 0.0]
    logits = _logits(probs)
    generator = torch.Generator().manual_seed(1)
    counts = collections.Counter(sample(logits, SampleParams(temperature=1.0), generator) for _ in range(20_000))
    assert counts[1] == counts[4] == 0, "a token of probability 0 was drawn"
    for token, p in enumerate(probs):
        assert counts[token] / 20_000 == pytest.approx(p, abs=0.015), (token, counts)


def test_top_k_and_top_p_leave_only_the_head() -> None:
    logits = _logits([0.4, 0.3, 0.2, 0.1])
    generator = torch.Generator().manual_seed(2)
    top_k = {sample(logits, SampleParams(temperature=1.0, top_k=2), generator) for _ in range(500)}
    top_p = {sample(logits, SampleParams(temperature=1.0, top_p=0.6), generator) for _ in range(500)}
    assert top_k == {0, 1} and top_p == {0, 1}


def test_a_seed_fixes_the_draw_and_the_last_token_is_reachable() -> None:
    logits = torch.randn(49_152)
    draws = {sample(logits, SampleParams(temperature=1.0, seed=7), torch.Generator()) for _ in range(5)}
    assert len(draws) == 1
    only_last = _logits([0.0] * 9 + [1.0])
    assert sample(only_last, SampleParams(temperature=1.0), torch.Generator().manual_seed(0)) == 9


def test_a_tiny_temperature_tends_to_the_maximal_tokens_and_inf_bias_wins() -> None:
    generator = torch.Generator().manual_seed(3)
    logits = torch.tensor([1.0, 2.0, 2.0, -5.0, 1.999])
    tiny = {sample(logits, SampleParams(temperature=1e-30), generator) for _ in range(200)}
    assert tiny == {1, 2}, "a tiny temperature must leave the tied maximal tokens, equally likely"
    biased = torch.tensor([5.0, float("inf"), 2.0, float("inf")])
    assert {sample(biased, SampleParams(temperature=1.0), generator) for _ in range(200)} == {1, 3}


def test_rows_without_a_finite_or_numeric_logit_are_refused() -> None:
    generator = torch.Generator().manual_seed(4)
    with pytest.raises(ProtocolError) as masked:
        sample(torch.full((8,), float("-inf")), SampleParams(temperature=1.0), generator)
    assert masked.value.code == ErrorCode.BAD_ARGS
    with pytest.raises(ProtocolError) as nan:
        sample(torch.tensor([0.0, float("nan")]), SampleParams(temperature=1.0), generator)
    assert nan.value.code == ErrorCode.INTERNAL


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_argmax_agrees_with_torch_on_ties_infinities_and_nan(dtype: torch.dtype) -> None:
    rows = [
        torch.randn(49_152),
        torch.tensor([3.0, 1.0, 3.0]),  # ties: the first
        torch.tensor([float("-inf"), float("-inf"), -1e30]),
        torch.tensor([1.0, float("inf"), float("inf")]),
        torch.tensor([1.0, float("nan"), 3.0]),  # NaN counts as maximal
        torch.randn(8, 100)[3],  # a view into a batch of rows
    ]
    for row in rows:
        row = row.to(dtype)
        assert argmax(row) == int(torch.argmax(row)), row
