"""The built-in OpenAI program's decode against a real worker: an answer whose every step
chooses alike is decoded inside the worker in one multi-step call and streamed token by token,
stop strings and all (the worker watches the text), with the same text as the token-by-token
path."""

from __future__ import annotations

import importlib.util
import json
import time
import uuid
from pathlib import Path

import pytest
import redis

import symphony as sy
from tests.conftest import redis_db_url

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]
MESSAGES = [{"role": "user", "content": "Name three colours of the rainbow."}]


def _builtin_program():
    """A fresh module of the built-in program (as the in-process launcher loads it)."""
    spec = importlib.util.spec_from_file_location("builtin_openai_lip", ROOT / "api/builtin_lips/openai_lip.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(worker, messages=MESSAGES, in_worker=True, **args):
    """(result, streamed deltas, the worker's pred calls for it). Not ``in_worker``: the program
    as if the worker took no stop strings, so it watches the text itself, token by token. The
    deltas are those the worker sent from inside the decode (``send_text``, on the run's stream),
    then those the program sent itself."""
    program = _builtin_program()
    if not in_worker:
        program.MAX_STOP_STRINGS = 0
    deltas: list[str] = []
    program.send_to_user = lambda message: deltas.append(message.get("delta", ""))
    run_id = f"r-{uuid.uuid4().hex[:8]}"
    info = worker.create_session(run_id=run_id)
    session = sy.connect(info.socket_path, info.token)
    sy.set_session(session)
    calls_before = worker.admin.stats()["scheduler"]["calls"]
    try:
        result = program.main({**({} if messages is None else {"messages": messages}), "temperature": 0, **args})
    finally:
        sy.set_session(None)
        session.close()
        usage = worker.end_session(info.session_id).usage
    return result, _worker_sent(run_id) + deltas, worker.admin.stats()["scheduler"]["calls"] - calls_before, usage


def _worker_sent(run_id: str) -> list[str]:
    """The deltas the worker sent on the run's stream: its events thread stores them a moment
    after they were sent, so they are read once their number held still for 0.2 s."""
    events = redis.Redis.from_url(redis_db_url(0))
    key = f"run:{run_id}"
    try:
        seen, deadline = -1, time.monotonic() + 5
        while (count := events.xlen(key)) != seen and time.monotonic() < deadline:
            seen = count
            time.sleep(0.2)
        entries = events.xrange(key)
        return [json.loads(f[b"data"])["data"].get("delta", "") for _, f in entries if f[b"type"] == b"message"]
    finally:
        events.delete(key)
        events.close()


def test_a_plain_answer_is_one_worker_call_streamed_token_by_token(gpu_worker_process) -> None:
    plain, deltas, calls, usage = _run(gpu_worker_process, max_tokens=24)
    # A stop string the text never contains, watched by the program: it looks at every token.
    stepped, _, stepped_calls, stepped_usage = _run(
        gpu_worker_process, max_tokens=24, stop=["\x00never"], in_worker=False
    )
    (choice,) = plain["choices"]
    assert choice == stepped["choices"][0] and plain["usage"] == stepped["usage"]
    assert choice["text"] and "".join(deltas) == choice["text"]
    assert len(deltas) > 1, "streamed as the tokens come, not at the end"
    assert calls == 2, "the prompt's call, then one call for the whole answer"
    # Token by token: the prompt's call, then one per token (none for the limit's last one).
    steps = plain["usage"]["completion_tokens"]
    assert stepped_calls == 1 + steps - (choice["finish_reason"] == "length")
    assert usage["pred_calls"] == stepped_usage["pred_calls"], "billed alike"


PROMPTS = [
    MESSAGES,
    [{"role": "user", "content": "Write a short story about a lighthouse."}],
    [{"role": "user", "content": "Übersetze: 日本語 and naïve café."}],
]


def _same_stops_fewer_calls(worker, cases) -> int:
    """For each (messages, sampling) case and strings whose first occurrence in its answer starts
    at the first character, a third and two thirds in: the same choice (text cut before the
    string, finish, tokens), usage and streamed text with the worker watching the strings as
    with the program watching every token, in two worker calls (the prompt's, then the whole
    answer's) instead of one per token. Returns how many took eight or more tokens."""
    many = 0
    for messages, params in cases:
        plain, _, _, _ = _run(worker, messages, max_tokens=32, **params)
        whole = plain["choices"][0]["text"]
        starts = sorted({0, len(whole) // 3, 2 * len(whole) // 3})
        stops = {whole[i : i + 3] for i in starts if whole.find(whole[i : i + 3]) == i}
        assert stops, whole
        for stop in sorted(stops):
            run = {"max_tokens": 32, "stop": ["\x00never", stop], **params}
            new, deltas, calls, usage = _run(worker, messages, **run)
            old, old_deltas, old_calls, old_usage = _run(worker, messages, in_worker=False, **run)
            (choice,) = new["choices"]
            assert choice == old["choices"][0] and new["usage"] == old["usage"], (stop, choice, old)
            assert choice["text"] == whole[: whole.find(stop)] and choice["finish_reason"] == "stop", (stop, choice)
            assert "".join(deltas) == "".join(old_deltas) == choice["text"], (stop, deltas, old_deltas, whole)
            assert usage["pred_calls"] == old_usage["pred_calls"], "billed alike"
            # Token by token: the prompt's call, then one per token but the one completing the stop.
            assert old_calls == new["usage"]["completion_tokens"]
            assert calls == min(2, old_calls), (stop, calls)
            many += old_calls >= 8
    return many


def test_stop_strings_are_watched_by_the_worker_with_the_text_of_the_token_by_token_path(gpu_worker_process) -> None:
    """Greedy and seeded sampling on the tiny model (its greedy answer is one line break after
    another, so sampling makes the strings fall past the first tokens)."""
    cases = [(m, {"temperature": 0}) for m in PROMPTS] + [
        (PROMPTS[0], {"temperature": 0.9, "seed": 7}),
        (PROMPTS[1], {"temperature": 1.0, "seed": 3}),
        (PROMPTS[2], {"temperature": 1.0, "seed": 11}),
    ]
    assert _same_stops_fewer_calls(gpu_worker_process, cases) >= 3, "strings many tokens in were tried"


def test_the_auto_tool_marker_is_watched_by_the_worker_too(gpu_worker_process) -> None:
    """``auto`` tools: the marker that opens a call is one more string the worker watches; an
    answer that never writes it is the token-by-token path's, in two calls."""
    from api.services.openai_tools import call_schema_text

    weather = {"name": "weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
    tools = {"call_schema": call_schema_text([weather]), "mode": "auto", "parallel": False}
    run = {"max_tokens": 24, "tools": tools, "temperature": 1.0, "seed": 5}
    new, deltas, calls, _ = _run(gpu_worker_process, **run)
    old, old_deltas, old_calls, _ = _run(gpu_worker_process, in_worker=False, **run)
    (choice,) = new["choices"]
    assert choice == old["choices"][0] and "tool_calls" not in choice and choice["finish_reason"] == "length"
    assert "".join(deltas) == "".join(old_deltas) == choice["text"]
    assert calls == 2 and old_calls == 24


@pytest.fixture(scope="module")
def model_worker(shared_real_model_worker):
    """A worker on the real default model: it writes the ``auto`` tool marker when asked to."""
    return shared_real_model_worker


def test_greedy_answers_of_the_real_model_stop_alike(model_worker) -> None:
    """Greedy decoding of the default model: real text, strings across words and tokens."""
    assert _same_stops_fewer_calls(model_worker, [(m, {"temperature": 0}) for m in PROMPTS]) >= 4


def test_an_auto_tool_call_opened_in_the_worker_is_the_token_by_token_paths(model_worker) -> None:
    """The marker ends the worker's decode like a stop string; the program cuts the text there
    and generates the call under its grammar, as when it watched every token itself."""
    from api.services.openai_tools import call_schema_text

    weather = {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
    # A prompt whose examples make the model answer with a call after a few words.
    shot = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "%s"}}\n</tool_call>\n'
    prompt = (
        f"Q: What is the weather in Rome?\nA: Let me check. {shot % 'Rome'}"
        f"Q: What is the weather in Oslo?\nA: Let me check. {shot % 'Oslo'}"
        "Q: What is the weather in Paris?\nA:"
    )
    tools = {"call_schema": call_schema_text([weather]), "mode": "auto", "parallel": False}
    run = {"max_tokens": 60, "tools": tools, "prompts": [prompt]}
    new, deltas, calls, _ = _run(model_worker, None, **run)
    old, old_deltas, old_calls, _ = _run(model_worker, None, in_worker=False, **run)
    (choice,) = new["choices"]
    strip = [{k: v for k, v in call.items() if k != "id"} for call in choice.get("tool_calls", [])]
    old_strip = [{k: v for k, v in call.items() if k != "id"} for call in old["choices"][0].get("tool_calls", [])]
    assert strip and strip == old_strip and choice["finish_reason"] == "tool_calls", (choice, old)
    assert choice["text"] == old["choices"][0]["text"] and new["usage"] == old["usage"]
    assert "".join(deltas) == "".join(old_deltas)
    # The call's grammar phase is token by token on both; the text before it is two calls here
    # (the prompt's and the worker's decode up to the marker), one per token there.
    assert choice["text"] and old_calls - calls >= 5, (choice["text"], calls, old_calls)


def test_penalties_keep_the_program_in_the_loop(gpu_worker_process) -> None:
    """A frequency penalty counts the tokens so far, which only the program does: token by token."""
    result, _, calls, _ = _run(gpu_worker_process, max_tokens=8, frequency_penalty=1.0)
    assert calls > 2 and result["choices"][0]["text"]


def test_the_streamer_sends_every_token_however_slow_its_sends_are():
    """What a run streams (and is billed for) depends on its tokens, not on timing: tokens that
    arrive while a send is in flight still go out one message each, in order."""
    import threading
    import time

    program = _builtin_program()
    program.detokenize = lambda ids: "".join(f"<{i}>" for i in ids)
    sent: list[str] = []
    first_send = threading.Event()

    class SlowChoice:
        def stream(self, text, final, hold=0):
            sent.append(text)
            first_send.set()
            time.sleep(0.05)  # every further token arrives during this send

    ids: list[int] = []
    streamer = program.Streamer(SlowChoice(), ids)
    ids.append(1)
    streamer.push()
    first_send.wait(5)
    for tok in (2, 3, 4):
        ids.append(tok)
        streamer.push()
    streamer.close()
    assert sent == ["<1>", "<1><2>", "<1><2><3>", "<1><2><3><4>"]


def test_what_a_stop_string_could_still_claim_is_held_back_before_an_incomplete_character():
    """Streamed text never shows a stop string's beginning: not when an incomplete character
    (U+FFFD until its next byte token) follows it either, as "お" before "わ" of "おわん" does."""
    program = _builtin_program()
    assert program._held_back("abc", ["cd"]) == 1 and program._held_back("abc", ["xy"]) == 0
    assert program._held_back("xお\ufffd", ["おわん"]) == 2
    assert program._held_back("xお\ufffd", ["zz"]) == 0  # (the stream drops the U+FFFD itself)
