"""The text a decode sends from inside the worker (gpu_worker/text_stream.py), fed by the stop
watch on the served model's real tokenizer: the deltas joined with what is held back are the
tokens' text, multi-byte characters split over byte tokens included; a stop string's possible
start is held back and nothing goes out from the token completing one; a refused send stops the
rest and hands it back as unsent."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_worker.stop_strings import StopWatch
from gpu_worker.text_stream import TextStream, held_back
from gpu_worker.tokenizer import Tokenizer

TEXT = "Hello, wörld! 日本語 text 🎉 and more: naïve café.\nThe end."


@pytest.fixture(scope="module")
def tok(default_model_dir: Path) -> Tokenizer:
    return Tokenizer(default_model_dir)


def _stream(tok: Tokenizer, ids: list[int], strings=(), context=(), keep=0, pending="") -> tuple[list[str], TextStream]:
    watch = StopWatch(tok.decode, strings, context, keep=keep)
    stream = TextStream({"index": 0}, pending + watch.context_text(keep), strings)
    deltas = []
    for t in ids:
        text = watch.feed(t)
        delta = stream.take(text, watch.matched is not None)
        if delta:
            deltas.append(delta)
            stream.sent_one()
    return deltas, stream


def test_the_deltas_are_the_tokens_text_and_never_half_a_character(tok) -> None:
    ids = tok.encode(TEXT)
    assert any("\ufffd" in tok.decode([t]) for t in ids), "the text has characters split over tokens"
    deltas, stream = _stream(tok, ids)
    assert "".join(deltas) == stream.sent_text() == TEXT and stream.unsent_text() == ""
    assert not any("\ufffd" in d for d in deltas)
    assert stream.payload("x") == {"index": 0, "delta": "x"}


def test_a_stop_strings_start_is_held_and_nothing_goes_out_past_the_string(tok) -> None:
    ids = tok.encode(TEXT)
    deltas, stream = _stream(tok, ids, strings=("naïve",))
    sent = "".join(deltas)
    assert TEXT.startswith(sent) and "naïve" not in sent and len(sent) >= TEXT.index("naïve") - 4
    assert stream.stopped
    # A possible start that comes to nothing is sent once it cannot grow into the string.
    deltas, stream = _stream(tok, ids, strings=("wörlds",))
    assert "".join(deltas) == TEXT


def test_held_back_is_the_longest_prefix_of_a_string_the_text_ends_with() -> None:
    assert held_back("say na", ("naïve", "nay")) == 2
    assert held_back("say n", ("naïve", "x")) == 1
    assert held_back("nothing", ("naïve",)) == 0
    assert held_back("", ("naïve",)) == 0
    assert held_back("ab", ("abc", "b")) == 2


def test_the_context_and_pending_text_go_out_first(tok) -> None:
    ids = tok.encode(TEXT)
    split = 6
    _, stream = _stream(tok, ids[split:], context=ids[:split], keep=2, pending="«")
    before = tok.decode(ids[: split - 2])
    assert "«" + TEXT[len(before) :] == stream.sent_text()


def test_a_refused_send_stops_the_rest_which_comes_back_unsent(tok) -> None:
    ids = tok.encode(TEXT)
    watch = StopWatch(tok.decode, ())
    stream = TextStream({}, "", ())
    for i, t in enumerate(ids):
        delta = stream.take(watch.feed(t), False)
        if delta and i < 5:
            stream.sent_one()
        elif delta:
            stream.refused()
    assert stream.closed and stream.sent_text() + stream.unsent_text() == TEXT
    assert TEXT.startswith(stream.sent_text()) and stream.unsent_text()
