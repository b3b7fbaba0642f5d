"""The built-in OpenAI program's decode against a real worker: a plain answer (nothing the
program must look at between tokens) is decoded inside the worker in one multi-step call and
streamed token by token, with the same text as the token-by-token path."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import symphony as sy

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]
MESSAGES = [{"role": "user", "content": "Name three colours of the rainbow."}]


def _builtin_program():
    """A fresh module of the built-in program (as the in-process launcher loads it)."""
    spec = importlib.util.spec_from_file_location("builtin_openai_lip", ROOT / "api/builtin_lips/openai_lip.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(worker, **args):
    """(result, streamed deltas, the worker's pred calls for it)."""
    program = _builtin_program()
    deltas: list[str] = []
    program.send_to_user = lambda message: deltas.append(message.get("delta", ""))
    info = worker.create_session()
    session = sy.connect(info.socket_path, info.token)
    sy.set_session(session)
    calls_before = worker.admin.stats()["scheduler"]["calls"]
    try:
        result = program.main({"messages": MESSAGES, "temperature": 0, **args})
    finally:
        sy.set_session(None)
        session.close()
        usage = worker.end_session(info.session_id).usage
    return result, deltas, worker.admin.stats()["scheduler"]["calls"] - calls_before, usage


def test_a_plain_answer_is_one_worker_call_streamed_token_by_token(gpu_worker_process) -> None:
    plain, deltas, calls, usage = _run(gpu_worker_process, max_tokens=24)
    # A stop string the text never contains makes the program look at every token.
    stepped, _, stepped_calls, stepped_usage = _run(gpu_worker_process, max_tokens=24, stop=["\x00never"])
    (choice,) = plain["choices"]
    assert choice == stepped["choices"][0] and plain["usage"] == stepped["usage"]
    assert choice["text"] and "".join(deltas) == choice["text"]
    assert len(deltas) > 1, "streamed as the tokens come, not at the end"
    assert calls == 2, "the prompt's call, then one call for the whole answer"
    # Token by token: the prompt's call, then one per token (none for the limit's last one).
    steps = plain["usage"]["completion_tokens"]
    assert stepped_calls == 1 + steps - (choice["finish_reason"] == "length")
    assert usage["pred_calls"] == stepped_usage["pred_calls"], "billed alike"


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
        def stream(self, text, final):
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
