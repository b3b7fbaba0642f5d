"""The worker's per-session trace (gpu_worker/tracing.py): spans kept one by one up to the
bound, then per-second buckets, then only counted; times relative to the session's start; the
off switch (``--trace off``, ``SYMPHONY_WORKER_TRACE``) that records nothing."""

from __future__ import annotations

import pytest

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
    # Each span a quarter second into its own second: ``(t0 + i) - t0`` may round to just under
    # ``i`` (t0 is the host's uptime), which put two spans in one bucket now and then.
    for i in range(MAX_SPANS + MAX_BUCKETS + 25):
        trace.add(tracing.SYSCALL, "pred", t0 + i + 0.25, t0 + i + 0.5)
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


def test_a_trace_that_is_off_records_nothing_and_says_so() -> None:
    trace = SessionTrace(enabled=False)
    t0 = trace.t0
    trace.add(tracing.SYSCALL, "pred", t0, t0 + 0.01, 0.001, 4, batch_size=2)
    trace.kv_out(t0 + 1, t0 + 1.01, 4096)
    trace.kv_back(t0 + 2, t0 + 2.02)
    wire = trace.to_wire(now=t0 + 3.0)
    assert wire["enabled"] is False and wire["duration_s"] == 3.0
    assert wire["spans"] == [] and wire["buckets"] == [] and wire["dropped"] == 0
    assert SessionTrace().to_wire()["enabled"] is True


@pytest.mark.parametrize(
    ("env", "argv", "want"),
    [
        (None, [], True),
        ("off", [], False),
        ("OFF", [], False),
        ("on", [], True),
        ("off", ["--trace", "on"], True),
        (None, ["--trace", "off"], False),
    ],
)
def test_the_worker_traces_unless_told_off(monkeypatch, env, argv, want) -> None:
    from gpu_worker.__main__ import _parser, build_config

    if env is None:
        monkeypatch.delenv("SYMPHONY_WORKER_TRACE", raising=False)
    else:
        monkeypatch.setenv("SYMPHONY_WORKER_TRACE", env)
    assert build_config(_parser().parse_args(argv)).trace is want


def test_a_trace_switch_that_is_neither_on_nor_off_is_refused(monkeypatch, capsys) -> None:
    from gpu_worker.__main__ import _parser

    monkeypatch.delenv("SYMPHONY_WORKER_TRACE", raising=False)
    with pytest.raises(SystemExit):
        _parser().parse_args(["--trace", "maybe"])
    assert "must be 'on' or 'off'" in capsys.readouterr().err
