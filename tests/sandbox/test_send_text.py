"""``pred_tokens(..., send_text=...)``: the worker sends the text of the tokens it chooses to the
run's user, against a real worker process and its Redis stream.

The contract (``protocol.Pred``'s ``send_text``, gpu_worker/text_stream.py): the messages are
what a program's own ``send_to_user`` of each token's new text would have sent (the same JSON,
the same bytes billed), their deltas joined with what was held back are the tokens' text, a
stop string's possible start is held back and nothing is sent from the token completing one,
and a run past its stream budget gets what it was sent and the rest back as ``unsent_text``."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

import symphony as sy
from gpu_worker import protocol
from symphony import aio
from tests.conftest import redis_db_url, wait_for
from tests.sandbox.test_pred_steps import PROMPT, _spanning_stop, one_by_one

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.timeout(180)]


class Stream:
    """A session of its own and the message events on its run's stream."""

    def __init__(self, worker: Any, **limits: Any) -> None:
        self.worker = worker
        run_id = f"r-{uuid.uuid4().hex[:8]}"
        self.info = worker.create_session(run_id=run_id, **limits)
        self.s = sy.connect(self.info.socket_path, self.info.token)
        self.events = redis.Redis.from_url(redis_db_url(0))
        self.key = f"run:{run_id}"
        self.usage: dict | None = None

    def messages(self, count: int | None = None) -> list[dict]:
        def read() -> list[dict]:
            entries = self.events.xrange(self.key)
            return [json.loads(f[b"data"])["data"] for _, f in entries if f[b"type"] == b"message"]

        if count is not None:
            wait_for(lambda: len(read()) >= count, timeout=10, message=f"{count} messages on {self.key}")
        return read()

    def close(self) -> dict:
        """End the session (once) and forget its stream; the session's usage."""
        if self.usage is None:
            self.s.close()
            self.usage = self.worker.end_session(self.info.session_id).usage
            self.events.delete(self.key)
        return self.usage


@pytest.fixture
def stream(gpu_worker_process) -> Iterator[Stream]:
    st = Stream(gpu_worker_process)
    try:
        yield st
    finally:
        st.close()


def test_each_tokens_text_goes_out_as_the_programs_own_message_would(stream, gpu_worker_process) -> None:
    s = stream.s
    ids = s.tokenize(PROMPT)
    want = one_by_one(s, ids, 24, temperature=1.0, seed=5)
    got = s.pred_tokens(s.kv_create(), ids, 24, temperature=1.0, seed=5, send_text={"index": 3})
    assert list(got) == want, "sending the text changes no token"
    text = s.detokenize(want)
    assert got.sent_text + got.unsent_text == text
    sent = stream.messages(count=1)
    assert all(set(m) == {"index", "delta"} and m["index"] == 3 and m["delta"] for m in sent)
    assert "".join(m["delta"] for m in sent) == got.sent_text
    assert len(sent) <= len(want)
    usage = stream.close()
    # The same messages sent by the program itself cost the same stream bytes.
    other = Stream(gpu_worker_process)
    for m in sent:
        other.s.send_to_user(m)
    assert usage["streamed_bytes"] == other.close()["streamed_bytes"] > 0


def test_a_stop_strings_start_is_held_back_and_nothing_goes_out_from_the_token_completing_it(stream) -> None:
    s = stream.s
    ids = s.tokenize(PROMPT)
    want = one_by_one(s, ids, 24, temperature=1.0, seed=5)
    stop, end = _spanning_stop(s, want)
    got = s.pred_tokens(s.kv_create(), ids, 24, temperature=1.0, seed=5, stop_strings=[stop], send_text={})
    assert list(got) == want[: end + 1] and got.stop_string == stop
    before_stop = s.detokenize(want[: end + 1]).split(stop)[0]
    assert before_stop.startswith(got.sent_text) and stop not in got.sent_text
    sent = [] if not got.sent_text else stream.messages(count=1)
    assert "".join(m["delta"] for m in sent) == got.sent_text


def test_the_text_goes_on_across_calls_and_after_the_context_the_program_chose(stream, monkeypatch) -> None:
    """Past ``MAX_PRED_STEPS`` each call goes on from what the one before held back; a first
    token chosen by the prompt's ``pred_token`` goes out with the first call's text
    (``send_context``)."""
    s = stream.s
    ids = s.tokenize(PROMPT)
    want = one_by_one(s, ids, 20, temperature=1.0, seed=5)
    monkeypatch.setattr(protocol, "MAX_PRED_STEPS", 3)
    kv = s.kv_create()
    first = s.pred_token(kv, ids, temperature=1.0, seed=5)
    rest = s.pred_tokens(
        kv, [first], 19, temperature=1.0, seed=6, stop_context=[first], send_text={"i": 0}, send_context=1
    )
    assert [first, *rest] == want
    assert rest.sent_text + rest.unsent_text == s.detokenize(want)
    assert "".join(m["delta"] for m in stream.messages(count=1)) == rest.sent_text
    # Text the program held back itself goes out first.
    kv = s.kv_create()
    more = s.pred_tokens(kv, ids, 4, send_text={"i": 1}, send_pending="«held»")
    assert (more.sent_text + more.unsent_text).startswith("«held»")
    assert next(m["delta"] for m in stream.messages() if m["i"] == 1).startswith("«held»")


def test_past_the_runs_stream_budget_the_rest_comes_back_unsent(gpu_worker_process) -> None:
    st = Stream(gpu_worker_process, max_stream_bytes=120)
    try:
        s = st.s
        ids = s.tokenize(PROMPT)
        want = one_by_one(s, ids, 24, temperature=1.0, seed=5)
        got = s.pred_tokens(s.kv_create(), ids, 24, temperature=1.0, seed=5, send_text={"index": 0})
        assert list(got) == want, "the decode goes on; only its text stops going out"
        assert got.sent_text + got.unsent_text == s.detokenize(want) and got.unsent_text
        assert "".join(m["delta"] for m in st.messages()) == got.sent_text
        with pytest.raises(sy.QuotaExceeded, match="stream budget"):
            s.send_to_user({"index": 0, "delta": got.unsent_text})
    finally:
        usage = st.close()
    assert usage["streamed_bytes"] <= 120


def test_bad_send_arguments_are_refused_with_errors_that_say_what_is_wrong(stream) -> None:
    s = stream.s
    ids = s.tokenize(PROMPT)
    kv = s.kv_create()
    for kwargs, message in (
        ({"send_text": {"delta": "x"}}, 'no "delta" key'),
        ({"send_text": {"x": float("nan")}}, "JSON object"),
        ({"send_text": {"x": "y" * 2000}}, "at most 1024 bytes"),
        ({"send_text": {}, "send_context": 2, "stop_context": [5]}, "send_context names more tokens"),
    ):
        with pytest.raises(sy.InvalidArgument, match=message):
            s.pred_tokens(kv, ids, 2, **kwargs)
    for kwargs, message in (
        ({"send_pending": "x"}, "go with send_text"),
        ({"send_text": ["not", "a", "dict"]}, "must be a JSON object"),
        ({"send_text": {}, "send_context": -1}, "non-negative integer"),
    ):
        with pytest.raises(sy.InvalidArgument, match=message):
            s.pred_tokens(kv, ids, 2, **kwargs)
    with pytest.raises(sy.InvalidArgument, match="send_text sends the text of tokens chosen"):
        s.conn.call("pred", {"kv": kv.id, "tokens": ids, "send_text": {}})
    assert len(kv) == 0 and stream.messages() == [], "nothing refused landed or went out"


def test_the_asyncio_flavour_sends_the_text_too(gpu_worker_process) -> None:
    st = Stream(gpu_worker_process)

    async def run() -> tuple[list[int], str, str, str]:
        s = await aio.connect(st.info.socket_path, st.info.token)
        ids = await s.tokenize(PROMPT)
        got = await s.pred_tokens(await s.kv_create(), ids, 8, send_text={"index": 1})
        text = await s.detokenize(got)
        s.close()
        return list(got), got.sent_text, got.unsent_text, text

    try:
        got, sent, unsent, text = asyncio.run(run())
        assert len(got) == 8 and sent + unsent == text
        assert "".join(m["delta"] for m in st.messages(count=1)) == sent
    finally:
        st.close()
