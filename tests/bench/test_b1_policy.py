"""B1 v2's sizes and its LIP's online pin policy: pins follow the requests served, never a
ranking the trace generator knows; the corpus exceeds both sides' KV by construction."""

from __future__ import annotations

import pytest

from bench import b1_rag_pareto as b1
from bench.harness import pareto_trace
from bench.resources import kv_page_bytes


def test_pins_follow_the_counts_of_served_requests() -> None:
    policy = b1.FrequencyPins(budget=2)
    for doc in (5, 7, 7, 9):
        policy.observe(doc)
    unpin, pin = policy.changes()
    assert (unpin, pin) == (set(), {7, 5})  # 7 twice; 5 and 9 once each, 5 seen first
    policy.applied(unpin, pin)
    policy.observe(9)  # 9: two requests, 5: one
    assert policy.changes() == ({5}, {9})


def test_a_tie_keeps_what_is_pinned() -> None:
    policy = b1.FrequencyPins(budget=1)
    policy.observe(3)
    policy.applied(*policy.changes())
    assert policy.pinned == {3}
    policy.observe(4)  # 4 ties 3 (one request each): no churn
    assert policy.changes() == (set(), set())
    policy.observe(4)  # 4 passes 3
    assert policy.changes() == ({3}, {4})


def test_the_policy_learns_the_hot_documents_of_a_skewed_stream() -> None:
    """Fed a Pareto stretch, the counts find the most popular documents the generator drew."""
    policy = b1.FrequencyPins(budget=3)
    trace = pareto_trace(96, 200, 2.0, seed=0, part=0)
    for doc in trace:
        policy.observe(doc)
    policy.applied(*policy.changes())
    most = sorted(set(trace), key=lambda d: -trace.count(d))[:1]
    assert set(most) <= policy.pinned and len(policy.pinned) == 3


def test_default_sizes_put_the_corpus_above_both_sides_kv() -> None:
    wl = b1.Workload()
    device, host = wl.pages(b1.BLOCK_SIZE)
    assert wl.corpus_pages(b1.BLOCK_SIZE) > 2 * (device + host)  # either side's, and both together


def test_a_corpus_that_fits_is_refused() -> None:
    with pytest.raises(SystemExit):
        b1.parse(["--quick", "--docs", "4", "--model", "unused"])


def test_kv_arithmetic_of_the_default_model(default_model_dir) -> None:
    """SmolLM2-135M in float32: 2 x 30 layers x 3 KV heads x 64 x 128 tokens x 4 B a page."""
    model = str(default_model_dir)
    assert kv_page_bytes(model, "float32", 128) == 2 * 30 * 3 * 64 * 128 * 4
    wl = b1.Workload()
    device, host = wl.pages(b1.BLOCK_SIZE)
    note = b1.kv_arithmetic(wl, model, "float32", device, host, device + host)
    assert "= 5,898,240 B (5.62 MiB)" in note and f"{wl.docs} documents = {wl.corpus_pages(128)} pages" in note
