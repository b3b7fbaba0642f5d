"""The task-free ``pred`` path (``gpu_worker.ops.pred``): replies, deadline, abandonment and
the session's reservations, with a stand-in scheduler whose futures the test settles (from
another thread, as the engine thread does). The real worker's ``pred`` runs through this path
in every SDK, sandbox and benchmark test; these cover the cases those cannot time."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
from dataclasses import dataclass, field
from typing import Any

import pytest

from gpu_worker import protocol
from gpu_worker.config import SchedulerConfig
from gpu_worker.kvfs.errors import NotFound
from gpu_worker.ops.pred import PredRelay
from gpu_worker.protocol import ErrorCode
from gpu_worker.scheduler import PredCall
from gpu_worker.sessions import SessionLimits, WorkerSession


class StandInScheduler:
    def __init__(self) -> None:
        self.calls: list[PredCall] = []

    def submit(self, call: PredCall) -> concurrent.futures.Future:
        self.calls.append(call)
        return call.future


@dataclass
class StandInContext:
    """The part of ``ops.context.OpContext`` the relay uses (``ops.pred.PredContext``)."""

    scheduler: StandInScheduler = field(default_factory=StandInScheduler)
    vocab_size: int = 100
    max_inflight_preds: int = SchedulerConfig().max_inflight_preds_per_session
    tokenizer: Any = None
    events: Any = None


class CharTokenizer:
    """Token ``i`` is the character ``chr(ord("a") + i % 26)``."""

    @staticmethod
    def decode(ids) -> str:
        return "".join(chr(ord("a") + i % 26) for i in ids)


class StandInEvents:
    """``EventPublisher.send``: records each message; from ``refuse_from`` on, answers with a
    future the store settles with a refusal (an account's share of the streams was full)."""

    def __init__(self, refuse_from: int | None = None) -> None:
        self.sent: list[str] = []
        self.refuse_from = refuse_from

    def send(self, run_id: str, account: str, type_: str, payload: str) -> concurrent.futures.Future | None:
        self.sent.append(payload)
        if self.refuse_from is None or len(self.sent) <= self.refuse_from:
            return None
        refused: concurrent.futures.Future = concurrent.futures.Future()
        refused.set_result(object())
        return refused


class RecordingWriter:
    def __init__(self) -> None:
        self.replies: list[dict[str, Any]] = []


def _send(writer: RecordingWriter, reply: dict[str, Any]) -> None:
    protocol.pack(reply)  # every reply must be encodable
    writer.replies.append(reply)


def _session(**limits: Any) -> WorkerSession:
    return WorkerSession("s1", "tenant-a", "run-1", SessionLimits(**limits), "/nonexistent.sock", max_dists=16)


async def _until(predicate, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.005)


def _relay(session: WorkerSession) -> tuple[PredRelay, StandInContext, RecordingWriter]:
    worker, writer = StandInContext(), RecordingWriter()
    return PredRelay(worker, session, writer, _send), worker, writer


def _settle_from_another_thread(call: PredCall, value: Any) -> None:
    def settle() -> None:
        if isinstance(value, BaseException):
            call.future.set_exception(value)
        else:
            call.ran = True
            call.future.set_result(value)

    t = threading.Thread(target=settle)
    t.start()
    t.join()


def test_a_settled_call_is_answered_and_its_reservations_released() -> None:
    async def scenario() -> None:
        s = _session(max_tokens=100)
        relay, worker, writer = _relay(s)
        relay.start(7, {"kv": 1, "tokens": [1, 2, 3], "then": "argmax"})
        assert len(relay) == 1 and s.inflight_preds == 1 and s.reserved_tokens == 3
        _settle_from_another_thread(worker.scheduler.calls[0], [42])
        await _until(lambda: writer.replies)
        assert writer.replies == [protocol.ok_reply(7, {"tokens": [42]})]
        assert len(relay) == 0 and s.inflight_preds == 0 and s.reserved_tokens == 0
        assert s.usage.pred_calls == 1

    asyncio.run(scenario())


def test_a_call_without_then_gets_dist_handles() -> None:
    import torch

    async def scenario() -> None:
        s = _session()
        relay, worker, writer = _relay(s)
        relay.start(1, {"kv": 1, "tokens": [5]})
        _settle_from_another_thread(worker.scheduler.calls[0], [torch.zeros(100)])
        await _until(lambda: writer.replies)
        (handle,) = writer.replies[0]["ok"]["dists"]
        assert s.dists.get(handle).shape == (100,)

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (protocol.ProtocolError(ErrorCode.NO_SPACE, "too long"), ErrorCode.NO_SPACE),
        (NotFound("no such handle"), ErrorCode.NOT_FOUND),
        (RuntimeError("a bug"), ErrorCode.INTERNAL),
    ],
)
def test_a_failed_call_is_answered_with_its_error_code(error: BaseException, code: ErrorCode) -> None:
    async def scenario() -> None:
        s = _session()
        relay, worker, writer = _relay(s)
        relay.start(3, {"kv": 1, "tokens": [5], "then": "argmax"})
        _settle_from_another_thread(worker.scheduler.calls[0], error)
        await _until(lambda: writer.replies)
        (reply,) = writer.replies
        assert reply["id"] == 3 and reply["err"]["code"] == code
        assert s.inflight_preds == 0 and s.reserved_tokens == 0

    asyncio.run(scenario())


def test_a_refused_call_is_answered_at_once_and_never_submitted() -> None:
    async def scenario() -> None:
        s = _session(max_tokens=2)
        relay, worker, writer = _relay(s)
        relay.start(1, {"kv": 1, "tokens": [1, 2, 3]})  # over the token budget
        relay.start(2, {"kv": 1, "tokens": [1000]})  # outside the vocabulary
        assert [r["err"]["code"] for r in writer.replies] == [ErrorCode.QUOTA, ErrorCode.BAD_ARGS]
        assert worker.scheduler.calls == [] and s.inflight_preds == 0 and s.reserved_tokens == 0

    asyncio.run(scenario())


def test_the_run_deadline_answers_a_call_in_flight_with_timeout() -> None:
    async def scenario() -> None:
        s = _session(deadline_s=0.2)
        relay, worker, writer = _relay(s)
        relay.start(9, {"kv": 1, "tokens": [1], "then": "argmax"})
        await _until(lambda: writer.replies)
        (reply,) = writer.replies
        assert reply["id"] == 9 and reply["err"]["code"] == ErrorCode.TIMEOUT
        assert "deadline" in reply["err"]["message"]
        assert worker.scheduler.calls[0].future.cancelled()
        assert len(relay) == 0 and s.inflight_preds == 0 and s.reserved_tokens == 0
        # The engine settling it afterwards changes nothing.
        with pytest.raises(concurrent.futures.InvalidStateError):
            worker.scheduler.calls[0].future.set_result([1])
        await asyncio.sleep(0.05)
        assert len(writer.replies) == 1 and s.inflight_preds == 0

    asyncio.run(scenario())


def test_a_closed_connection_abandons_its_calls_without_replies() -> None:
    async def scenario() -> None:
        s = _session(deadline_s=60)
        relay, worker, writer = _relay(s)
        for i in range(3):
            relay.start(i, {"kv": 1, "tokens": [1], "then": "argmax"})
        assert s.inflight_preds == 3
        relay.abandon_all()
        await _until(lambda: s.inflight_preds == 0)
        assert writer.replies == [] and len(relay) == 0 and s.reserved_tokens == 0
        assert all(c.future.cancelled() for c in worker.scheduler.calls)

    asyncio.run(scenario())


def test_send_text_goes_out_as_messages_and_a_refusal_stops_it_and_refunds_the_bytes() -> None:
    """The engine thread hands each delta to ``on_text``; the loop sends it as ``send_to_user``
    would. Past the account's share (the store refuses) nothing more of the call's text goes
    out, the refused bytes are not billed, and the reply hands the rest back as unsent."""

    async def scenario(refuse_from: int | None) -> tuple[dict, list[str], int]:
        s = _session()
        relay, worker, writer = _relay(s)
        worker.tokenizer, worker.events = CharTokenizer(), StandInEvents(refuse_from)
        relay.start(1, {"kv": 1, "tokens": [5], "then": "argmax", "steps": 4, "send_text": {"index": 2}})
        call = worker.scheduler.calls[0]
        assert call.text_stream is not None and call.watch is not None

        def engine() -> None:  # what ``Scheduler._next_step`` does with each chosen token
            for token in (0, 1, 2, 3):
                delta = call.text_stream.take(call.watch.feed(token), False)
                if delta:
                    call.on_text(delta)
                    threading.Event().wait(0.02)  # the loop sends it (and hears of a refusal)

        await asyncio.to_thread(engine)  # the loop stays free to send meanwhile
        _settle_from_another_thread(call, [0, 1, 2, 3])
        await _until(lambda: writer.replies)
        return writer.replies[0]["ok"], worker.events.sent, s.usage.streamed_bytes

    reply, sent, billed = asyncio.run(scenario(None))
    assert reply["sent_text"] == "abcd" and reply["unsent_text"] == ""
    assert [protocol_json(p) for p in sent] == [{"index": 2, "delta": c} for c in "abcd"]
    assert billed > 0
    reply, sent, billed_after_refusal = asyncio.run(scenario(2))
    assert len(sent) == 3, "the refused one was tried, none after it"
    assert reply["sent_text"] + reply["unsent_text"] == "abcd" and reply["unsent_text"]
    assert billed_after_refusal < billed


def protocol_json(payload: str) -> dict:
    """The message a ``message`` event's payload carries."""
    return json.loads(payload)["data"]
