"""The per-account back-off after a killed grammar compile (gpu_worker/grammar_backoff.py): its
length, its doubling and reset, and that it touches only the account whose compile was killed.
The worker-level behaviour (a killed bomb, then EBUSY for the account's next first-time schema
while another account compiles at once) is in tests/reliability/test_grammar_isolation.py."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from gpu_worker import protocol
from gpu_worker.config import GrammarConfig
from gpu_worker.grammar import GrammarCompiler
from gpu_worker.grammar_backoff import CompileBackoff
from gpu_worker.protocol import ErrorCode, ProtocolError
from tests.plugins.clock import ManualClock


def test_a_kill_refuses_that_accounts_compiles_for_the_backoff_and_no_one_elses() -> None:
    clock = ManualClock()
    backoff = CompileBackoff(20.0, 300.0, clock)
    backoff.check("acct-a")  # nothing killed yet
    assert backoff.killed("acct-a") == 20.0
    with pytest.raises(ProtocolError) as refused:
        backoff.check("acct-a")
    assert refused.value.code == ErrorCode.BUSY
    assert "grammar_kill_backoff_s" in refused.value.message and "20 s more" in refused.value.message
    backoff.check("acct-b")  # another account compiles as before
    clock.now += 19.5
    with pytest.raises(ProtocolError):
        backoff.check("acct-a")
    clock.now += 1.0
    backoff.check("acct-a")  # the back-off ended
    assert backoff.refused == 2


def test_kills_in_a_row_double_the_backoff_up_to_its_bound_and_a_quiet_time_resets_it() -> None:
    clock = ManualClock()
    backoff = CompileBackoff(20.0, 300.0, clock)
    waits = []
    for _ in range(6):
        waits.append(backoff.killed("acct-a"))
        clock.now += waits[-1] + 10.0  # the next bomb is killed 10 s after the back-off ends
    assert waits == [20.0, 40.0, 80.0, 160.0, 300.0, 300.0]
    clock.now += 301.0  # quiet for longer than the longest back-off since the last one ended
    assert backoff.killed("acct-a") == 20.0


def test_a_zero_backoff_never_refuses() -> None:
    backoff = CompileBackoff(0.0, 0.0)
    assert backoff.killed("acct-a") == 0.0
    backoff.check("acct-a")
    assert backoff.refused == 0


#: Nested bounded repetitions within the pre-compile budget (256 copies each) that compile for
#: 7-11 s here (tests/reliability/test_grammar_isolation.py): far past a 1 s budget.
BOMB = {
    "type": "object",
    "properties": {
        f"p{i}": {"type": "string", "pattern": f"^([a-w]{{1,{a}}}){{1,{b}}}$"}
        for i, (a, b) in enumerate(((16, 16), (15, 17), (17, 15), (12, 20)))
    },
    "required": ["p0", "p1", "p2", "p3"],
}


def test_a_killed_compile_refuses_its_accounts_new_grammars_but_not_cached_ones_or_others(
    default_model_dir: Path,
) -> None:
    """The worker's compiler with its real child processes: an account's bomb is killed at the
    1 s budget (EINVAL), then that account's never-seen schema is refused at once (EBUSY naming
    the back-off, not remembered as the schema's refusal), a grammar compiled before still
    answers it, and another account's never-seen schema compiles."""
    from transformers import AutoTokenizer

    vocab = len(AutoTokenizer.from_pretrained(str(default_model_dir)))
    budget = GrammarConfig(timeout_s=1.0, kill_backoff_s=60.0, kill_backoff_max_s=300.0)
    compiler = GrammarCompiler(str(default_model_dir), vocab, budget)

    def schema(title: str) -> protocol.Grammar:
        return protocol.Grammar(json_schema={"type": "object", "title": title})

    async def scenario() -> dict:
        await compiler.start()
        try:
            await compiler.compile(schema("before"), "acct-a")
            with pytest.raises(ProtocolError) as killed:
                await compiler.compile(protocol.Grammar(json_schema=BOMB), "acct-a")
            started = time.monotonic()
            with pytest.raises(ProtocolError) as backoff:
                await compiler.compile(schema("fresh-a"), "acct-a")
            refused_in = time.monotonic() - started
            assert await compiler.compile(schema("before"), "acct-a") is not None  # a cache hit
            assert await compiler.compile(schema("fresh-b"), "acct-b") is not None
            return {"killed": killed.value, "backoff": backoff.value, "refused_in": refused_in}
        finally:
            await compiler.close()

    out = asyncio.run(scenario())
    assert out["killed"].code == ErrorCode.BAD_ARGS and "grammar_compile_timeout_s" in out["killed"].message
    assert out["backoff"].code == ErrorCode.BUSY and "grammar_kill_backoff_s" in out["backoff"].message
    assert out["refused_in"] < 0.5, out
    assert compiler.stats()["killed"] == 1 and compiler.stats()["backoff_refused"] == 1, compiler.stats()
