"""The engine timeline (gpu_worker/engine_timeline.py) and the run's trace context on the
worker: a bounded ring of forwards, served over the admin socket; ``create_session`` takes the
run's W3C trace context as a typed field and the forwards its session rides carry it."""

from __future__ import annotations

import time
import uuid

import pytest

import symphony as sy
from gpu_worker import engine_timeline, protocol
from gpu_worker.engine_timeline import EngineTimeline, ForwardRecord
from gpu_worker.protocol import ErrorCode, ProtocolError, TraceContext

TRACE = TraceContext(0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, 1)


def _forward(i: int, accounts: tuple[tuple[str, int], ...] = (("a", 1),)) -> ForwardRecord:
    return ForwardRecord(1000.0 + i, 0.01, len(accounts), 0, len(accounts), len(accounts), accounts)


def test_the_ring_keeps_the_last_forwards_and_counts_them_all() -> None:
    ring = EngineTimeline(capacity=5)
    for i in range(12):
        ring.record(_forward(i))
    reply = ring.snapshot()
    assert reply.capacity == 5 and reply.recorded == 12 and len(ring) == 5
    assert [row[0] for row in reply.forwards] == [1007.0, 1008.0, 1009.0, 1010.0, 1011.0], "oldest first"
    assert [row[0] for row in ring.snapshot(limit=2).forwards] == [1010.0, 1011.0]


def test_the_default_ring_is_the_protocols_bound() -> None:
    ring = EngineTimeline()
    for i in range(protocol.MAX_TIMELINE_FORWARDS + 7):
        ring.record(_forward(i))
    assert len(ring.snapshot().forwards) == protocol.MAX_TIMELINE_FORWARDS == ring.capacity


def test_accounts_travel_once_and_expand_back_to_tokens_per_account() -> None:
    ring = EngineTimeline()
    ring.record(ForwardRecord(5.0, 0.02, 3, 40, 2, 2, (("acct:x", 41), ("tenant:y", 1))))
    ring.record(ForwardRecord(5.1, 0.01, 1, 0, 1, 1, (("tenant:y", 1),)))
    reply = ring.snapshot()
    assert reply.accounts == ["tenant:y", "acct:x"]  # indexed newest first
    rows = engine_timeline.expand(protocol.EngineTimelineReply.to_wire(reply))
    assert rows[0] == {
        "start": 5.0,
        "duration_s": 0.02,
        "batch_size": 3,
        "prompt_tokens": 40,
        "decode_tokens": 2,
        "sessions": 2,
        "accounts": 2,
        "tokens_per_account": {"acct:x": 41, "tenant:y": 1},
    }
    assert rows[1]["tokens_per_account"] == {"tenant:y": 1}


def test_a_reply_names_a_bounded_number_of_accounts(monkeypatch) -> None:
    monkeypatch.setattr(engine_timeline, "MAX_REPLY_ACCOUNTS", 3)
    ring = EngineTimeline()
    for i in range(4):
        ring.record(_forward(i, ((f"acct:{i}", 1),)))
    reply = ring.snapshot()
    # The newest three forwards fit; the oldest one is left out of the reply.
    assert [row[0] for row in reply.forwards] == [1001.0, 1002.0, 1003.0] and len(reply.accounts) == 3


def test_a_sink_is_told_every_forward() -> None:
    told: list[ForwardRecord] = []
    ring = EngineTimeline(capacity=2, sink=told.append)
    for i in range(3):
        ring.record(_forward(i))
    assert len(told) == 3 and len(ring) == 2


def test_create_session_carries_a_typed_traceparent() -> None:
    args = protocol.CreateSession(tenant="t", run_id="r", trace=TRACE)
    wire = args.to_wire()
    assert wire["trace"] == "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert protocol.CreateSession.decode(wire).trace == TRACE
    assert protocol.CreateSession.decode({"tenant": "t", "run_id": "r"}).trace is None
    bad = [
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  # upper case
        "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # another version
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # a zero trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # a zero span id
        42,
    ]
    for value in bad:
        with pytest.raises(ProtocolError) as refused:
            protocol.CreateSession.decode({"tenant": "t", "run_id": "r", "trace": value})
        assert refused.value.code == ErrorCode.BAD_ARGS and "trace must be a W3C traceparent" in refused.value.message


@pytest.mark.integration
@pytest.mark.vllm
@pytest.mark.timeout(180)
def test_the_worker_serves_its_forwards_and_a_session_keeps_its_trace_context(gpu_worker_process) -> None:
    """Through the real worker: a traced session's prompt and decode steps are in the timeline
    the admin socket serves, under the session's account; a bad ``trace`` is EINVAL."""
    worker = gpu_worker_process
    with pytest.raises(ProtocolError) as refused:
        worker.admin.call("create_session", {"tenant": "t-bad", "run_id": "r", "trace": "00-nope"})
    assert refused.value.code == ErrorCode.BAD_ARGS and "trace" in refused.value.message

    tenant = f"t-{uuid.uuid4().hex[:8]}"
    began = time.time()
    info = worker.admin.create_session(tenant, f"r-{uuid.uuid4().hex[:8]}", {}, trace=TRACE)
    s = sy.connect(info.socket_path, info.token)
    try:
        ids = s.tokenize(f"An engine timeline {uuid.uuid4().hex} shows")  # no cached prefix
        s.pred_tokens(s.kv_create(), ids, 5, stop=[])
    finally:
        s.close()
        worker.admin.end_session(info.session_id)

    reply = worker.admin.engine_timeline()
    assert reply.capacity == protocol.MAX_TIMELINE_FORWARDS and reply.recorded >= len(reply.forwards) >= 5
    rows = engine_timeline.expand(protocol.EngineTimelineReply.to_wire(reply))
    ours = [r for r in rows if f"tenant:{tenant}" in r["tokens_per_account"]]
    assert all(r["start"] >= began - 1 and r["duration_s"] > 0 for r in ours)
    assert sum(r["prompt_tokens"] for r in ours) == len(ids) and sum(r["decode_tokens"] for r in ours) == 4
    assert sum(r["tokens_per_account"][f"tenant:{tenant}"] for r in ours) == len(ids) + 4
    assert all(r["sessions"] == 1 and r["accounts"] == 1 and r["batch_size"] == 1 for r in ours)
    assert [r["start"] for r in rows] == sorted(r["start"] for r in rows)
    assert len(worker.admin.engine_timeline(limit=2).forwards) == 2
