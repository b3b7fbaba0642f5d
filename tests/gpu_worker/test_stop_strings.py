"""The worker's stop-string watch (gpu_worker/stop_strings.py) on the served model's real
tokenizer: its incremental text is the text of decoding the whole list, multi-byte characters
split over byte tokens included, each step decodes a few tokens (not the answer so far), and a
string is found where it ends, across tokens and across the context a call starts from."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from gpu_worker.stop_strings import MAX_UNREAD, StopWatch
from gpu_worker.tokenizer import Tokenizer

TEXT = "Hello, wörld! 日本語 text 🎉 and more: naïve café, Ελληνικά.\nThe end."


@pytest.fixture(scope="module")
def tok(default_model_dir: Path) -> Tokenizer:
    return Tokenizer(default_model_dir)


class CountingDecode:
    """The tokenizer's decode, counting the tokens each call decodes."""

    def __init__(self, tok: Tokenizer) -> None:
        self.tok, self.tokens, self.calls = tok, 0, 0

    def __call__(self, ids) -> str:
        self.calls += 1
        self.tokens += len(ids)
        return self.tok.decode(ids)


def _ends_at(watch: StopWatch, token: int) -> bool:
    """Feed ``token``; whether the text now holds a stop string (the call ends there)."""
    watch.feed(token)
    return watch.matched is not None


def _watch_all(tok: Tokenizer, ids: list[int], strings=("\x00never",), context=()) -> tuple[str, StopWatch]:
    watch = StopWatch(tok.decode, strings, context)
    return "".join(watch.feed(t) for t in ids), watch


def test_the_text_taken_is_the_whole_lists_text_multi_byte_characters_included(tok) -> None:
    ids = tok.encode(TEXT)
    assert any("\ufffd" in tok.decode([t]) for t in ids), "the text has characters split over tokens"
    watch = StopWatch(tok.decode, ["\x00never"])
    taken = ""
    for i, t in enumerate(ids):
        taken += watch.feed(t)
        whole = tok.decode(ids[: i + 1])
        # At every step: the whole list's text, less the token text an incomplete character ends.
        rest = whole[len(taken) :]
        assert whole.startswith(taken) and (rest == "" or (rest.endswith("\ufffd") and len(rest) <= 3))
    assert taken == TEXT == tok.decode(ids)


def test_random_token_lists_decode_alike_and_each_step_decodes_a_few_tokens(tok) -> None:
    rng = random.Random(7)
    for _ in range(20):
        ids = [rng.randrange(tok.vocab_size) for _ in range(200)]
        counting = CountingDecode(tok)
        watch = StopWatch(counting, ["\x00never"])
        taken = "".join(watch.feed(t) for t in ids)
        whole = tok.decode(ids)
        assert whole.startswith(taken) and (whole == taken or whole.endswith("\ufffd"))
        assert counting.calls == 2 * len(ids) + 1  # two per token, one for the (empty) context
        assert counting.tokens < 12 * len(ids), "a window of a few tokens, not the answer so far"


def test_a_string_is_found_at_the_token_that_completes_it_across_two_tokens(tok) -> None:
    ids = tok.encode("The quick brown fox jumps over the lazy dog")
    texts = [tok.decode([t]) for t in ids]
    k = texts.index(" brown")
    stop = texts[k][-2:] + texts[k + 1][:3]  # "wn" + " fo": spans two tokens
    watch = StopWatch(tok.decode, ["\x00never", stop])
    ended = [i for i, t in enumerate(ids) if _ends_at(watch, t)]
    assert ended and ended[0] == k + 1 and watch.matched == stop
    # A multi-byte character split over byte tokens ends it only once complete.
    ids = tok.encode("ab 日本 cd")
    watch = StopWatch(tok.decode, ["日"])
    stops_at = next(i for i, t in enumerate(ids) if _ends_at(watch, t))
    assert "日" in tok.decode(ids[: stops_at + 1]) and "日" not in tok.decode(ids[:stops_at])


def test_the_earliest_string_wins_and_a_match_within_the_context_is_not_looked_for(tok) -> None:
    ids = tok.encode("alpha beta gamma delta")
    watch = StopWatch(tok.decode, ["gamma", "beta gamma"])
    assert any(_ends_at(watch, t) for t in ids) and watch.matched == "beta gamma"
    # "beta" is in the context's text only: not found; "ta gam" begins there and ends after it.
    cut = len(tok.encode("alpha beta"))
    context, rest = ids[:cut], ids[cut:]
    assert tok.decode(context) + tok.decode(rest) == tok.decode(ids)
    watch = StopWatch(tok.decode, ["beta"], context)
    assert not any(_ends_at(watch, t) for t in rest)
    watch = StopWatch(tok.decode, ["ta gam"], context)
    assert _ends_at(watch, rest[0]) and watch.matched == "ta gam"


def test_a_context_ending_mid_character_leaves_that_character_to_the_call(tok) -> None:
    ids = tok.encode("x日y")
    split = next(i for i in range(1, len(ids)) if tok.decode(ids[:i]).endswith("\ufffd"))
    text, watch = _watch_all(tok, ids[split:], ["日"], ids[:split])
    assert watch.matched == "日" and text.startswith("日")


def test_every_string_ends_at_the_token_where_the_whole_lists_text_first_holds_it(tok) -> None:
    """What a program's loop of ``detokenize`` of the answer so far decides, token for token:
    strings next to, before and inside characters split over tokens included."""
    ids = tok.encode(TEXT)
    wholes = [tok.decode(ids[: i + 1]) for i in range(len(ids))]
    for length in (1, 2, 3, 5):
        for start in range(len(TEXT) - length + 1):
            stop = TEXT[start : start + length]
            want = next(i for i, whole in enumerate(wholes) if stop in whole)
            watch = StopWatch(tok.decode, [stop])
            got = next((i for i, t in enumerate(ids) if _ends_at(watch, t)), None)
            assert got == want, f"{stop!r}"


def test_a_long_context_is_decoded_only_as_far_as_the_strings_reach(tok) -> None:
    ids = tok.encode("word " * 600 + "the end of it")
    cut = len(ids) - 2
    assert tok.decode(ids[:cut]).endswith(" end"), "the string begins in the context"
    counting = CountingDecode(tok)
    watch = StopWatch(counting, ["d of"], ids[:cut])
    assert counting.tokens < 100, "not the 600-token context"
    ended = [_ends_at(watch, t) for t in ids[cut:]]
    assert ended[0] and watch.matched == "d of"


def test_tokens_that_never_complete_a_character_keep_the_window_bounded(tok) -> None:
    """A decode a mask keeps to lone UTF-8 lead bytes: each step still decodes a bounded window."""
    lead = next(
        t for t in range(tok.vocab_size) if tok.decode([t]) == "\ufffd" and tok.decode([t, t]) == "\ufffd\ufffd"
    )
    counting = CountingDecode(tok)
    watch = StopWatch(counting, ["\x00never"])
    for _ in range(300):
        watch.feed(lead)
    assert counting.tokens < 300 * 2 * (2 * MAX_UNREAD + 2), "not the whole answer (90,000)"
