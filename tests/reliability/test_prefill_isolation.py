"""One account's long prompts must not make another tenant's short call slow.

Found by an attacker: two ~3,800-token prompts at a time from one tenant took another tenant's
8-token call from ~1 s to 11.5-15.4 s, because every forward that carried the victim's token
also carried hundreds of tokens of the attacker's prompts (a DRR quantum of each). The scheduler
now bounds, while more than one account has queued work, each account's prefill tokens per
forward by its fair share of a *contended step* sized from measured forward cost, so the
victim's forwards stay short.

Here, against a real worker (tiny float32 model, prefix cache off so every prompt is computed):
tenants ``attacker-1`` and ``attacker-2`` of ONE account keep a ~3,800-token prompt each in
flight, over and over, while tenant ``canary`` (another account) sends an 8-token prompt and
decodes a few tokens, one ``pred`` per token as a LIP does. The canary's time under that load
against its idle time (medians of several runs) must stay within ``MAX_RATIO``, and the attacker's
prompts must still complete with the same greedy tokens as alone (chunked prefill is exact).

Why 2x here and not the 1.5x docs/SECURITY.md promises: this machine has two cores, and the
test's own threads (the attacker's clients, the canary's client, the worker's event loop) share
them with the engine, which no scheduler of ours can take back; the measured ratio is printed.
Before the change the same test measured the canary at 4.1x, 5.5x and 6.2x its idle time; after it,
1.5-1.8x (a contended step of ~80 tokens: 6.5 ms decode forwards, ~80 us a prompt token).

A CI run then measured 2.87x with a 499-token step: each large forward's price per token was
fixed when it was recorded, against the decode floor of the moment, so the attacker's first
chunks, priced against a new worker's slow first decode forwards, came out at a few microseconds
a token, and that minimum sized the step (here 96-682 tokens from run to run). Priced when read,
against the floor then, at the first quartile (``Metrics.token_cost``), the step stays at 91-111
tokens and ten runs of 15 rounds measured 1.36-1.57x.
"""

from __future__ import annotations

import random
import statistics
import threading
import time
from pathlib import Path

import pytest

import symphony as sy
from tests.plugins.worker import RunningWorker, start_worker

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.timeout(600)]

MAX_RATIO = 2.0
PROMPT_TOKENS = 3800
ROUNDS = 15
DECODE_TOKENS = 4
ATTACKER_ACCOUNT = "u-attacker"


@pytest.fixture(scope="module")
def worker(tiny_model_dir: Path):
    """A private worker whose context holds the long prompts, prefix cache off: a repeated prompt
    must be computed again, not mapped from the cache."""
    extra = ["--max-model-len", "4096", "--no-prefix-cache"]
    with start_worker(tiny_model_dir, name="prefill-iso", num_pages=1024, extra_args=extra) as w:
        yield w


def _connect(worker: RunningWorker, tenant: str, **limits) -> sy.Session:
    info = worker.create_session(tenant, **limits)
    return sy.connect(info.socket_path, info.token)


def _complete(s: sy.Session, prompt: list[int], n: int) -> list[int]:
    """Greedy tokens after ``prompt``, one ``pred`` per token (a LIP's loop)."""
    kv = s.kv_create()
    try:
        out = [s.pred_token(kv, prompt)]
        for _ in range(n - 1):
            out.append(s.pred_token(kv, out[-1:]))
        return out
    finally:
        kv.close()


def _canary(s: sy.Session, prompt: list[int]) -> float:
    started = time.perf_counter()
    _complete(s, prompt, DECODE_TOKENS + 1)
    return time.perf_counter() - started


def test_one_accounts_long_prompts_leave_another_tenants_short_call_within_bound(worker) -> None:
    rng = random.Random(7)
    prompts = [[rng.randrange(100, 40000) for _ in range(PROMPT_TOKENS)] for _ in range(2)]
    short = [rng.randrange(100, 40000) for _ in range(8)]
    attackers = [_connect(worker, f"attacker-{i + 1}", account=ATTACKER_ACCOUNT) for i in range(2)]
    canary = _connect(worker, "canary")
    # Alone: the attacker's reference tokens, and the canary's idle time.
    reference = [_complete(attackers[i], prompts[i], 2) for i in range(2)]
    _canary(canary, short)  # warm the small shapes
    idle = []
    for _ in range(ROUNDS):
        idle.append(_canary(canary, short))
        time.sleep(0.05)

    stop = threading.Event()
    completions: list[list[list[int]]] = [[], []]
    errors: list[BaseException] = []

    def attack(i: int) -> None:
        try:
            while not stop.is_set():
                completions[i].append(_complete(attackers[i], prompts[i], 2))
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    threads = [threading.Thread(target=attack, args=(i,), daemon=True) for i in range(2)]
    before = worker.admin.stats()["scheduler"]["tokens"]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while worker.admin.stats()["scheduler"]["tokens"] < before + PROMPT_TOKENS and time.monotonic() < deadline:
        time.sleep(0.1)  # the attack is on once a prompt's worth of its tokens went through
    loaded = []
    for _ in range(ROUNDS):
        loaded.append(_canary(canary, short))
        time.sleep(0.05)
    overlapped = all(t.is_alive() for t in threads) and not errors
    stats = worker.admin.stats()["scheduler"]
    # Let each attacker finish at least one prompt under contention, then stop them.
    deadline = time.monotonic() + 240
    while min(len(c) for c in completions) < 1 and time.monotonic() < deadline and not errors:
        time.sleep(0.2)
    stop.set()
    for t in threads:
        t.join(timeout=240)
    ratio = statistics.median(loaded) / statistics.median(idle)
    print(
        f"\ncanary idle (s):   {[round(x, 3) for x in idle]}"
        f"\ncanary loaded (s): {[round(x, 3) for x in loaded]}"
        f"\nattacker prompts completed: {[len(c) for c in completions]}"
        f"\ncontended step: {stats.get('contended_step_tokens')} tokens (decode forward "
        f"{stats.get('decode_forward_ms_ema')} ms, {stats.get('token_us_ema')} us a token)"
        f"\nratio of medians: {ratio:.2f}x (bound {MAX_RATIO}x)"
    )
    for s in (*attackers, canary):
        s.close()
    worker.assert_alive()
    assert not errors, errors
    assert overlapped, "the attacker's prompts were not in flight throughout the canary's runs"
    for i in range(2):
        assert completions[i], f"attacker {i + 1} completed no prompt under contention"
        assert all(c == reference[i] for c in completions[i]), (reference[i], completions[i])
    assert ratio <= MAX_RATIO, f"one account's long prompts slowed the canary {ratio:.2f}x (bound {MAX_RATIO}x)"
