"""``pred_tokens``: a decode of many tokens inside the worker, against a real worker process.

The contract (``protocol.Pred``'s ``steps``): the same tokens as one ``pred_token`` a step, the
last one not in the file yet, early end at a stop token or where a step cannot run (the next
call says why), ``seed + j`` at step ``j``, and each token streamed before the call returns."""

from __future__ import annotations

import asyncio

import pytest

import symphony as sy
from gpu_worker import protocol
from symphony import aio

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.timeout(180)]

PROMPT = "The capital of France is a city where"


def one_by_one(s: sy.Session, ids: list[int], n: int, **choice) -> list[int]:
    """The reference: one ``pred_token`` a step, seeded ``seed + step`` as ``pred_tokens`` is."""
    kv, out, pending, seed = s.kv_create(), [], ids, choice.pop("seed", None)
    for step in range(n):
        tok = s.pred_token(kv, pending, seed=None if seed is None else seed + step, **choice)
        out.append(tok)
        pending = [tok]
    return out


def test_steps_choose_what_one_call_a_step_chooses_and_stream_each_token(session) -> None:
    ids = session.tokenize(PROMPT)
    want = one_by_one(session, ids, 10)
    kv, streamed = session.kv_create(), []
    got = session.pred_tokens(kv, ids, 10, on_token=streamed.append)
    assert got == want and streamed == want
    assert session.kv_tokens(kv) == ids + got[:-1], "the last token is not in the file yet, as with pred_token"
    assert session.pred_tokens(kv, got[-1:], 3) == one_by_one(session, ids + got, 3)


def test_each_step_is_metered_as_one_forward_call(gpu_worker_process) -> None:
    """Billing does not depend on how a program issues its steps: ``pred_calls`` counts the
    forwards, as one ``pred_token`` a step would."""
    info = gpu_worker_process.create_session()
    s = sy.connect(info.socket_path, info.token)
    try:
        ids = s.tokenize(PROMPT)
        s.pred_tokens(s.kv_create(), ids, 6, stop=[])
    finally:
        s.close()
        usage = gpu_worker_process.end_session(info.session_id).usage
    assert usage["pred_calls"] == 6
    assert usage["prefill_tokens"] == len(ids) and usage["decode_tokens"] == 5


def test_sampled_steps_use_seed_plus_step_and_a_stop_token_ends_the_call(session) -> None:
    ids = session.tokenize(PROMPT)
    want = one_by_one(session, ids, 8, temperature=1.0, seed=41)
    assert session.pred_tokens(session.kv_create(), ids, 8, temperature=1.0, seed=41) == want
    stop = want[3]
    cut = want.index(stop) + 1
    kv = session.kv_create()
    assert session.pred_tokens(kv, ids, 8, temperature=1.0, seed=41, stop=[stop]) == want[:cut]
    assert len(kv) == len(ids) + cut - 1


def test_more_steps_than_one_call_takes_go_in_several_calls(session, monkeypatch) -> None:
    """Past ``MAX_PRED_STEPS`` the SDK goes on in a next call: same tokens, seeds carried over."""
    ids = session.tokenize(PROMPT)
    want = one_by_one(session, ids, 9, temperature=0.8, seed=7)
    monkeypatch.setattr(protocol, "MAX_PRED_STEPS", 4)
    streamed: list[int] = []
    got = session.pred_tokens(session.kv_create(), ids, 9, temperature=0.8, seed=7, on_token=streamed.append)
    assert got == want and streamed == want


def test_a_step_that_cannot_run_ends_the_call_and_the_next_call_says_why(session, gpu_worker_process) -> None:
    """The worker runs with --max-model-len 2048: a decode that reaches it returns what it chose,
    and appending the last token is refused with NoSpace, as it is token by token."""
    kv = session.kv_create()
    session.release(session.pred(kv, [5] * 2040))
    got = session.pred_tokens(kv, [6], 50)
    assert len(got) == 8 and len(kv) == 2048
    with pytest.raises(sy.NoSpace):
        session.pred_tokens(kv, got[-1:], 5)
    with gpu_worker_process.session(max_tokens=30) as info:
        s = sy.connect(info.socket_path, info.token)
        try:
            ids = s.tokenize(PROMPT)
            got = s.pred_tokens(s.kv_create(), ids, 100)
            assert len(got) == 30 - len(ids) + 1, "steps stop where the run's token budget does"
            with pytest.raises(sy.QuotaExceeded):
                s.pred_tokens(s.kv_create(), [1], 1)
        finally:
            s.close()


def test_a_failing_callback_fails_its_call_after_the_reply_and_the_session_goes_on(session) -> None:
    ids = session.tokenize(PROMPT)

    def boom(token: int) -> None:
        raise RuntimeError("the program's callback failed")

    with pytest.raises(RuntimeError, match="callback failed"):
        session.pred_tokens(session.kv_create(), ids, 4, on_token=boom)
    assert session.pred_tokens(session.kv_create(), ids, 2) == one_by_one(session, ids, 2)


def test_bad_steps_are_refused_with_errors_that_say_what_is_wrong(session) -> None:
    ids = session.tokenize(PROMPT)
    kv = session.kv_create()
    with pytest.raises(sy.InvalidArgument, match="steps must be a positive integer"):
        session.pred_tokens(kv, ids, 0)
    state = session.grammar(regex="(yes|no)").state()
    conn = session.conn
    for args, message in (
        ({"steps": 4}, "steps > 1 needs then"),
        ({"steps": 4, "then": {"argmax": {}}, "positions": [0]}, "last position only"),
        ({"steps": 4, "then": {"argmax": {"mask": state.id}}}, "needs advance"),
        ({"steps": protocol.MAX_PRED_STEPS + 1, "then": {"argmax": {}}}, "steps"),
        ({"steps": 2, "then": {"argmax": {}}, "stop": [10**9]}, "stop"),
    ):
        with pytest.raises(sy.InvalidArgument, match=message):
            conn.call("pred", {"kv": kv.id, "tokens": ids, **args})
    assert len(kv) == 0, "nothing refused landed"


def test_asyncio_flavour_streams_steps_on_its_loop(gpu_worker_process) -> None:
    info = gpu_worker_process.create_session()

    async def run() -> tuple[list[int], list[int], list[int]]:
        s = await aio.connect(info.socket_path, info.token)
        ids = await s.tokenize(PROMPT)
        loop, streamed = asyncio.get_running_loop(), []

        def on_token(token: int) -> None:
            assert asyncio.get_running_loop() is loop
            streamed.append(token)

        got = await s.pred_tokens(await s.kv_create(), ids, 6, on_token=on_token)
        ref = await s.generate(await s.kv_create(), ids, 6, stop=[])
        # The text of the first three tokens, as a stop string: first whole at the third.
        text = await s.detokenize(got[:3])
        cut = await s.pred_tokens(await s.kv_create(), ids, 6, stop_strings=[text])
        assert list(cut) == got[:3] and cut.stop_string == text
        s.close()
        return got, streamed, ref

    try:
        got, streamed, ref = asyncio.run(run())
    finally:
        gpu_worker_process.end_session(info.session_id)
    assert got == streamed == ref


def test_generate_ended_by_a_stop_token_leaves_prompt_and_output_in_the_file(session) -> None:
    """The stop token is neither returned nor appended, and no token is appended twice."""
    ids = session.tokenize(PROMPT)
    want = one_by_one(session, ids, 12, temperature=1.0, seed=5)  # (greedy repeats one token)
    cut = next(i for i in range(1, 12) if want[i] not in want[:i])  # a token not generated before
    stop = want[cut]
    kv = session.kv_create()
    out = session.generate(kv, ids, 12, stop=[stop], temperature=1.0, seed=5)
    assert out == want[:cut] and session.kv_tokens(kv) == ids + out


def _spanning_stop(s: sy.Session, tokens: list[int], first: int = 1) -> tuple[str, int]:
    """A string whose first whole-text occurrence spans tokens ``k`` and ``k + 1`` (``k`` from
    ``first`` on): (it, k + 1)."""
    for k in range(first, len(tokens) - 1):
        a, b = s.detokenize(tokens[k : k + 1]), s.detokenize(tokens[k + 1 : k + 2])
        if not a or not b or "\ufffd" in a + b:
            continue
        stop = a[-1] + b[0]
        if stop not in s.detokenize(tokens[: k + 1]) and stop in s.detokenize(tokens[: k + 2]):
            return stop, k + 1
    raise AssertionError(f"no stop string spans two tokens of {tokens}")


def test_a_stop_string_spanning_two_tokens_ends_the_call_at_the_token_completing_it(session) -> None:
    """The worker detokenises the tokens it chooses: the call ends at the token whose text
    completes a string, returns it last (not in the file yet) and says which string it was."""
    ids = session.tokenize(PROMPT)
    want = one_by_one(session, ids, 24, temperature=1.0, seed=5)
    stop, end = _spanning_stop(session, want)
    kv = session.kv_create()
    got = session.pred_tokens(kv, ids, 24, temperature=1.0, seed=5, stop_strings=["\x00never", stop])
    assert list(got) == want[: end + 1] and got.stop_string == stop
    assert session.kv_tokens(kv) == ids + want[:end], "the last token is not in the file yet, as always"
    # A string that never comes: every step runs, and nothing is named.
    kv = session.kv_create()
    got = session.pred_tokens(kv, ids, 24, temperature=1.0, seed=5, stop_strings="\x00never")
    assert list(got) == want and got.stop_string is None
    # A string begun in the context's text: the answer's first token, chosen by an earlier call
    # and passed as ``stop_context``; without it the call sees only its own tokens' text.
    opening, second = _spanning_stop(session, want, first=0)
    assert second == 1, "the string spans the first two tokens"
    for context, want_end in (([want[0]], 1), ([], None)):
        kv = session.kv_create()
        first = session.pred_token(kv, ids, temperature=1.0, seed=5)
        assert first == want[0]
        rest = session.pred_tokens(
            kv, [first], 23, temperature=1.0, seed=6, stop_strings=[opening], stop_context=context
        )
        if want_end is None:
            assert rest.stop_string is None or len(rest) > 1
        else:
            assert [first, *rest] == want[: want_end + 1] and rest.stop_string == opening
    # generate: the token completing the string is returned and appended.
    kv = session.kv_create()
    out = session.generate(kv, ids, 24, temperature=1.0, seed=5, stop=[], stop_strings=[stop])
    assert list(out) == want[: end + 1] and out.stop_string == stop
    assert session.kv_tokens(kv) == ids + list(out)


def test_a_stop_string_across_two_calls_is_found_by_the_second(session, monkeypatch) -> None:
    """Past ``MAX_PRED_STEPS`` the next call watches on from the text of the tokens before it."""
    ids = session.tokenize(PROMPT)
    want = one_by_one(session, ids, 24, temperature=1.0, seed=5)
    stop, end = _spanning_stop(session, want)
    monkeypatch.setattr(protocol, "MAX_PRED_STEPS", end)  # the first call ends one token short
    streamed: list[int] = []
    got = session.pred_tokens(
        session.kv_create(), ids, 24, temperature=1.0, seed=5, stop_strings=[stop], on_token=streamed.append
    )
    assert list(got) == streamed == want[: end + 1] and got.stop_string == stop


def test_stop_strings_past_their_bounds_are_refused_with_einval(session) -> None:
    ids = session.tokenize(PROMPT)
    kv = session.kv_create()
    then = {"argmax": {}}
    conn = session.conn
    for args, message in (
        ({"steps": 4, "then": then, "stop_strings": ["a"] * (protocol.MAX_STOP_STRINGS + 1)}, "stop_strings"),
        ({"steps": 4, "then": then, "stop_strings": ["x" * (protocol.MAX_STOP_STRING_CHARS + 1)]}, "stop_strings"),
        ({"steps": 4, "then": then, "stop_strings": [""]}, "non-empty strings"),
        ({"steps": 4, "then": then, "stop_strings": [7]}, "stop_strings"),
        ({"stop_strings": ["a"]}, "need then"),
        ({"steps": 4, "then": then, "stop_strings": ["a"], "positions": [0]}, "last position only"),
        ({"steps": 4, "then": then, "stop_strings": ["a"], "stop_context": [1] * 600}, "stop_context"),
    ):
        with pytest.raises(sy.InvalidArgument, match=message) as raised:
            conn.call("pred", {"kv": kv.id, "tokens": ids, **args})
        assert raised.value.code == "EINVAL"
    with pytest.raises(sy.InvalidArgument, match="at most 128 characters"):
        session.pred_tokens(kv, ids, 4, stop_strings=["y" * 129])
    assert len(kv) == 0, "nothing refused landed"
    # At the bounds: accepted.
    got = session.pred_tokens(
        kv, ids, 3, stop_strings=["z" * protocol.MAX_STOP_STRING_CHARS] * protocol.MAX_STOP_STRINGS
    )
    assert len(got) == 3 and got.stop_string is None


@pytest.mark.docker
def test_a_sandboxed_program_ends_its_decode_at_a_stop_string(lip_runner) -> None:
    """The same through gVisor and the image's SDK: one ``pred_tokens`` call where the program
    would otherwise detokenise after every token."""
    run = lip_runner.run(
        """
        import symphony as sy

        def main(args):
            ids = sy.tokenize(args["prompt"])
            want = sy.pred_tokens(sy.kv_create(), ids, 16, temperature=1.0, seed=5)
            text = sy.detokenize(want[:5])
            got = sy.generate(sy.kv_create(), ids, 16, temperature=1.0, seed=5, stop=[], stop_strings=[text])
            return {"want": list(want), "got": list(got), "stop": got.stop_string, "text": text}
        """,
        {"prompt": PROMPT},
    )
    assert run.result.status == "succeeded", run.result
    out = run.result.result
    assert out["got"] == out["want"][:5] and out["stop"] == out["text"]
    # Prompt, the first decode's 16 steps and the second's 5 (its last token appended by generate).
    assert run.session_end.usage["pred_calls"] == 16 + 5 + 1
