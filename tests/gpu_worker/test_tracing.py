"""The worker's per-session trace (gpu_worker/tracing.py): spans kept one by one up to the
bound, then per-second buckets, then only counted; times relative to the session's start."""

from __future__ import annotations

from gpu_worker import tracing
from gpu_worker.tracing import MAX_BUCKETS, MAX_SPANS, SessionTrace


def test_spans_past_the_bound_fold_into_per_second_buckets() -> None:
    trace = SessionTrace()
    t0 = trace.t0
    for i in range(MAX_SPANS):
        trace.add(tracing.SYSCALL, "pred", t0 + i * 0.001, t0 + i * 0.001 + 0.0005, 0.0001, 1, batch_size=3)
    # 10 more in second 5, 4 in second 7: two buckets.
    for i in range(10):
        trace.add(tracing.SYSCALL, "pred", t0 + 5.0 + i * 0.01, t0 + 5.0 + i * 0.01 + 0.002, 0.001, 1)
    for _ in range(4):
        trace.add(tracing.IO, "sleep", t0 + 7.2, t0 + 7.7)
    wire = trace.to_wire(now=t0 + 8.0)
    assert len(wire["spans"]) == MAX_SPANS and wire["dropped"] == 0
    first = wire["spans"][0]
    assert first["start_s"] == 0.0 and first["attrs"] == {"batch_size": 3, "queue_wait_s": 0.0001, "tokens": 1}
    buckets = {(b["name"], b["second"]): b for b in wire["buckets"]}
    assert set(buckets) == {("pred", 5), ("sleep", 7)}
    pred = buckets[("pred", 5)]
    assert pred["count"] == 10 and pred["tokens"] == 10
    assert abs(pred["duration_s"] - 0.02) < 1e-6 and abs(pred["queue_wait_s"] - 0.01) < 1e-6
    assert buckets[("sleep", 7)]["count"] == 4 and abs(buckets[("sleep", 7)]["end_s"] - 7.7) < 1e-6
    assert wire["duration_s"] == 8.0


def test_the_buckets_are_bounded_too_and_the_rest_is_counted() -> None:
    trace = SessionTrace()
    t0 = trace.t0
    for i in range(MAX_SPANS + MAX_BUCKETS + 25):
        trace.add(tracing.SYSCALL, "pred", t0 + i, t0 + i + 0.5)
    wire = trace.to_wire()
    assert len(wire["spans"]) == MAX_SPANS
    assert len(wire["buckets"]) == MAX_BUCKETS and wire["dropped"] == 25


def test_a_kv_move_back_carries_the_bytes_that_left() -> None:
    trace = SessionTrace()
    t0 = trace.t0
    trace.kv_out(t0 + 1, t0 + 1.01, 4096)
    trace.kv_back(t0 + 2, t0 + 2.02)
    moves = trace.to_wire()["spans"]
    assert [(m["name"], m["attrs"]["bytes"]) for m in moves] == [("device->host", 4096), ("host->device", 4096)]


def test_ops_are_classed_by_what_their_time_is() -> None:
    assert tracing.op_kind("sleep") == tracing.IO and tracing.op_kind("http_fetch") == tracing.IO
    assert tracing.op_kind("channel_recv") == tracing.WAIT and tracing.op_kind("child_wait") == tracing.WAIT
    assert tracing.op_kind("kv_create") == tracing.SYSCALL
