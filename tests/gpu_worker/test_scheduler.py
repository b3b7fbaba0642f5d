"""The two-level scheduler: DRR fairness across tenants, decode-first continuous batching,
chunked prefill under the token budget, and batches that really merge sessions.

Unit tests drive the real ``Scheduler`` and ``KVFS`` over an in-memory paged KV tensor
(``MemPageIO``) with a forward that records each batch and returns logits derived from the
tokens, so every property is checked exactly. The last test runs the same scheduler on the real
vLLM engine in a subprocess (one engine per process) and checks that one forward served several
sessions and that batched logits equal the same calls run one at a time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from gpu_worker.batch import Batch
from gpu_worker.config import SchedulerConfig
from gpu_worker.kvfs import Owner
from gpu_worker.scheduler import ContextFull, FairQueue, PredCall, Scheduler
from gpu_worker.tracing import SessionTrace
from gpu_worker.usage import Usage
from tests.kvfs.memio import BLOCK, make_fs

ROOT = Path(__file__).resolve().parents[2]
VOCAB = 64


@dataclass(eq=False)
class FakeSession:
    """Only what the scheduler reads of a session (``SessionView``)."""

    session_id: str
    tenant: str
    weight: float = 1.0
    swapped: bool = False
    run_id: str = "run"
    tokens: int = 0
    usage: Usage = field(default_factory=Usage)
    trace: SessionTrace = field(default_factory=SessionTrace)
    #: The person behind the tenant ("": the tenant is its own account, as the worker does).
    account: str = ""
    owner: Owner = field(init=False)

    def __post_init__(self) -> None:
        self.owner = Owner(self.tenant, self.session_id)
        self.account = self.account or f"tenant:{self.tenant}"

    def on_tokens(self, n: int, prefill: bool | None = None) -> None:
        self.tokens += n

    def on_cached_tokens(self, n: int) -> None:
        self.usage.cached_tokens += n

    def unreserve_tokens(self, n: int) -> None:
        self.unreserved += n

    unreserved: int = 0


class RecordingEngine:
    """Writes KV like a real engine would (through MemPageIO) and records every batch.

    The logits row of a position is a one-hot of ``(token + position) % VOCAB`` so a test can
    tell exactly which token at which position produced it.
    """

    def __init__(self, io, forward_s: float = 0.0) -> None:
        self.io = io
        self.forward_s = forward_s
        self.batches: list[Batch] = []
        self.released: list[str] = []

    def forward(self, batch: Batch) -> list[torch.Tensor]:
        self.batches.append(batch)
        time.sleep(self.forward_s)  # the scheduler's bounded wait is about one forward
        self.io.apply_copies(batch.page_copies)
        out = []
        for item in batch.items:
            rows = torch.zeros(len(item.logits_rows), VOCAB)
            for i, r in enumerate(item.logits_rows):
                pos = item.num_computed_tokens + r
                rows[i, (item.new_token_ids[r] + pos) % VOCAB] = 1.0
            for i, tok in enumerate(item.new_token_ids):
                pos = item.num_computed_tokens + i
                self.io.pages[item.page_ids[pos // BLOCK], :, pos % BLOCK, :] = float(tok * 1000 + pos)
            out.append(rows)
        return out

    def release(self, seq_id: str) -> None:
        self.released.append(seq_id)

    def claim_forward_thread(self) -> None:
        self.forward_thread = threading.current_thread()


# ------------------------------------------------------------------------------ FairQueue
def _call(session: FakeSession, n: int) -> PredCall:
    return PredCall(session=session, kv=0, tokens=tuple(range(1, n + 1)), rows=(n - 1,))


def _contended_decode_seats(q: FairQueue, first: FakeSession, second: FakeSession) -> list[str]:
    """Eight decode calls from each of two sessions for eight seats: the tenants seated, in order."""
    for _ in range(8):
        q.push(_call(first, 1))
        q.push(_call(second, 1))
    return [c.tenant for c, _ in q.select(budget=100, max_seqs=8, skip=lambda c: False)]


def test_decode_calls_go_before_prefill_chunks() -> None:
    q = FairQueue(quantum=64)
    a, b = FakeSession("sa", "a"), FakeSession("sb", "b")
    prefill = _call(a, 500)
    decode = _call(b, 1)
    q.push(prefill)
    q.push(decode)
    picked = q.select(budget=100, max_seqs=8, skip=lambda c: False)
    assert picked[0] == (decode, 1)
    assert picked[1][0] is prefill and picked[1][1] <= 99


def test_drr_shares_prefill_tokens_fairly_between_backlogged_tenants() -> None:
    """Tenant a queues many more (and longer) calls than b; over many batches both get the
    same token share while both are backlogged."""
    q = FairQueue(quantum=32)
    a, b = FakeSession("sa", "a"), FakeSession("sb", "b")
    for _ in range(40):
        q.push(_call(a, 300))
    for _ in range(10):
        q.push(_call(b, 100))
    served = {"a": 0, "b": 0}
    for _ in range(20):  # b's 1000 tokens are not exhausted within 20 x 64 / 2 tokens
        for call, n in q.select(budget=64, max_seqs=8, skip=lambda c: False):
            served[call.tenant] += n
            call.done += n
            if call.remaining:
                q.push(call, front=True)
    assert served["a"] + served["b"] == 20 * 64
    assert abs(served["a"] - served["b"]) <= 0.1 * served["a"], served


def test_contended_decode_seats_go_to_the_least_served_tenant() -> None:
    """More decode calls than seats: a tenant whose seats carried long prefills (many tokens
    served) yields seats to one that only decodes; equal counters split the seats evenly."""
    q = FairQueue(quantum=512)
    heavy, light = FakeSession("sh", "heavy"), FakeSession("sl", "light")
    q.push(_call(light, 1))
    q.select(budget=300, max_seqs=8, skip=lambda c: False)  # 1 token served to light
    q.push(_call(heavy, 300))
    for call, n in q.select(budget=300, max_seqs=8, skip=lambda c: False):
        assert call.tenant == "heavy" and n == 300  # 300 tokens served to heavy
    assert _contended_decode_seats(q, heavy, light) == ["light"] * 8

    even = FairQueue(quantum=64)
    a, b = FakeSession("sa", "a"), FakeSession("sb", "b")
    assert sorted(_contended_decode_seats(even, a, b)) == ["a"] * 4 + ["b"] * 4


def test_a_tenant_takes_at_most_its_contended_seats_while_another_is_served() -> None:
    """A flood of 64 one-token calls (or two-token ones, which go through the prefill pass)
    from one tenant fills a forward alone; while a narrow tenant has a call queued, or queued
    one within ``idle_reset_s``, it gets ``contended_seats`` and the forward stays short."""
    for tokens in (1, 2):
        q = FairQueue(quantum=256, idle_reset_s=5.0, contended_seats=8)
        flood, canary = FakeSession("sf", "flood"), FakeSession("sc", "canary")
        for _ in range(64):
            q.push(_call(flood, tokens))
        alone = q.select(budget=2048, max_seqs=64, skip=lambda c: False)
        assert len(alone) == 64, "alone, a tenant fills the batch"
        for _ in range(64):
            q.push(_call(flood, tokens))
        q.push(_call(canary, 1))
        picked = [c.tenant for c, _ in q.select(budget=2048, max_seqs=64, skip=lambda c: False)]
        assert picked.count("flood") == 8 and picked.count("canary") == 1, picked
        # The canary's call is in the running forward, its next not queued yet: still contended.
        picked = [c.tenant for c, _ in q.select(budget=2048, max_seqs=64, skip=lambda c: False)]
        assert picked == ["flood"] * 8, picked
    uncapped = FairQueue(quantum=256)
    for _ in range(64):
        uncapped.push(_call(flood, 1))
    uncapped.push(_call(canary, 1))
    assert len(uncapped.select(budget=2048, max_seqs=64, skip=lambda c: False)) == 64
    # Two wide tenants are not capped below each other's width: they fill the batch together.
    q = FairQueue(quantum=256, idle_reset_s=5.0, contended_seats=8)
    wide = FakeSession("sw", "wide")
    for _ in range(40):
        q.push(_call(flood, 1))
        q.push(_call(wide, 1))
    picked = [c.tenant for c, _ in q.select(budget=2048, max_seqs=64, skip=lambda c: False)]
    assert picked.count("flood") == 32 and picked.count("wide") == 32, picked


def test_two_tenants_of_one_account_share_its_contended_seats() -> None:
    """Found by the account soak: two tenants of one person, 16 one-token calls wide each,
    justified each other's width and took 32 seats of every forward beside another account's
    1-wide canary. The cap is per account: they take ``contended_seats`` in all, shared between
    them, while the canary's account is active; another account as wide still fills the batch
    beside them."""
    q = FairQueue(quantum=256, idle_reset_s=5.0, contended_seats=8)
    one = FakeSession("s1", "one", account="person")
    two = FakeSession("s2", "two", account="person")
    canary = FakeSession("sc", "canary")
    for _ in range(16):
        q.push(_call(one, 1))
        q.push(_call(two, 1))
    q.push(_call(canary, 1))
    picked = [c.tenant for c, _ in q.select(budget=2048, max_seqs=64, skip=lambda c: False)]
    assert picked.count("one") == 4 and picked.count("two") == 4 and picked.count("canary") == 1, picked
    assert q.capped_backlog() and q.seatable(64) == 8
    wide = FakeSession("sw", "wide")
    q = FairQueue(quantum=256, idle_reset_s=5.0, contended_seats=8)
    for _ in range(16):
        q.push(_call(one, 1))
        q.push(_call(two, 1))
    for _ in range(32):
        q.push(_call(wide, 1))
    picked = [c.tenant for c, _ in q.select(budget=2048, max_seqs=64, skip=lambda c: False)]
    assert picked.count("one") + picked.count("two") == 32 and picked.count("wide") == 32, picked


def test_an_accounts_capped_seats_go_to_its_oldest_calls_so_its_prompt_is_not_starved() -> None:
    """Capped at one seat beside a 1-wide canary, an account with a long prompt queued before
    16 one-token calls runs the prompt (its decodes wait their turn): decodes first would give
    every seat to the decodes and the prompt would never run."""
    q = FairQueue(quantum=256, idle_reset_s=5.0, contended_seats=1)
    one = FakeSession("s1", "one", account="person")
    two = FakeSession("s2", "two", account="person")
    canary = FakeSession("sc", "canary")
    prompt = _call(two, 300)
    q.push(prompt)
    for _ in range(16):
        q.push(_call(one, 1))
    q.push(_call(canary, 1))
    picked = q.select(budget=2048, max_seqs=64, skip=lambda c: False)
    assert [(c.tenant, n) for c, n in picked if c.account == "person"] == [("two", 256)], picked
    assert [c.tenant for c, _ in picked if c.tenant == "canary"] == ["canary"]
    # With no older prompt queued, the account's seat goes to its oldest decode.
    q.push(_call(canary, 1))
    picked = q.select(budget=2048, max_seqs=64, skip=lambda c: False)
    assert sorted(c.tenant for c, _ in picked) == ["canary", "one"], picked


def test_a_prefill_only_tenant_gets_a_seat_when_decodes_fill_them() -> None:
    """Found by B7: two tenants' decodes alone fill every seat; a third tenant, no more served
    than they are, whose only call is its prompt must still get a seat for a prefill chunk."""
    q = FairQueue(quantum=64)
    a, b, c = FakeSession("sa", "a"), FakeSession("sb", "b"), FakeSession("sc", "c")
    for _ in range(8):
        q.push(_call(a, 1))
        q.push(_call(b, 1))
    q.push(_call(c, 100))
    picked = q.select(budget=200, max_seqs=8, skip=lambda c: False)
    assert len(picked) == 8
    assert [(call.tenant, n) for call, n in picked if call.tenant == "c"] == [("c", 64)]
    assert sorted(call.tenant for call, _ in picked if call.tenant != "c") == ["a"] * 4 + ["b"] * 3


def test_a_contended_prefill_chunk_keeps_its_tenant_level_with_those_left_out() -> None:
    """Found by B7 on a fast CPU: the seated prompt of a prefill-only tenant landed whole (a few
    hundred tokens) in a forward whose other seats carried one token each, putting its tenant
    that far ahead of tenants whose decodes were left out. With ``prefill_slack`` the chunk
    stops ``prefill_slack`` tokens above the lowest of their counters; the rest of the prompt
    follows in later forwards, and over the stretch all three stay level. Without contention
    (every decode fits) the prompt is chunked by the token budget alone."""
    q = FairQueue(quantum=256, prefill_slack=8)
    a, b, c = FakeSession("sa", "a"), FakeSession("sb", "b"), FakeSession("sc", "c")
    prompt = _call(c, 300)
    q.push(prompt)
    served = {"a": 0, "b": 0, "c": 0}
    for _ in range(30):
        for session in (a, b):  # each always has more decodes runnable than seats
            while sum(1 for call in q.queues.get(session.tenant, ()) if call.remaining == 1) < 8:
                q.push(_call(session, 1))
        for call, n in q.select(budget=2048, max_seqs=8, skip=lambda c: False):
            served[call.tenant] += n
            call.done += n
            if call.remaining:
                q.push(call, front=True)
        gap = max(q.served.values()) - min(q.served.values())
        assert gap <= 8 + 1, (served, q.served)
    assert 0 < served["c"] < 300 and abs(served["c"] - served["a"]) <= 9, served

    unbounded = FairQueue(quantum=256, prefill_slack=8)
    prompt = _call(c, 300)
    unbounded.push(prompt)
    for _ in range(3):
        unbounded.push(_call(a, 1))
    picked = unbounded.select(budget=2048, max_seqs=8, skip=lambda c: False)
    assert (prompt, 300) in picked  # whole: nobody was left out, and nobody else has a prompt


def test_a_returning_tenant_banks_no_priority() -> None:
    """A tenant idle past ``idle_reset_s`` restarts at the lowest counter of the queued tenants,
    not at its old (lower) count, so it shares seats instead of taking them all."""
    q = FairQueue(quantum=64, idle_reset_s=0.0)
    busy, back = FakeSession("sb", "busy"), FakeSession("sr", "back")
    for _ in range(20):
        q.push(_call(busy, 50))
        for call, n in q.select(budget=50, max_seqs=8, skip=lambda c: False):
            call.done += n
    time.sleep(0.01)
    assert sorted(_contended_decode_seats(q, busy, back)) == ["back"] * 4 + ["busy"] * 4


def test_counters_restart_level_after_every_tenant_was_idle() -> None:
    """Found by B7: a tenant served alone at the end of one busy period (the others had nothing
    queued) kept its high counter through a pause of the whole worker and then lost every
    contended seat of the next busy period until the others caught up."""
    q = FairQueue(quantum=64, idle_reset_s=0.0)
    alone, other = FakeSession("sa", "alone"), FakeSession("so", "other")
    q.push(_call(other, 1))
    q.select(budget=50, max_seqs=8, skip=lambda c: False)
    for _ in range(20):  # 1000 tokens to ``alone`` while ``other`` asks for nothing
        q.push(_call(alone, 50))
        for call, n in q.select(budget=50, max_seqs=8, skip=lambda c: False):
            call.done += n
    time.sleep(0.01)
    assert sorted(_contended_decode_seats(q, other, alone)) == ["alone"] * 4 + ["other"] * 4


def test_long_idle_tenants_are_forgotten_after_counters_restart() -> None:
    """A worker serving many tenants over its life keeps no per-tenant state for those long
    gone, also when an idle worker restarted the counters (which empties ``served``)."""
    q = FairQueue(quantum=64, idle_reset_s=0.001)
    for i in range(70):
        q.push(_call(FakeSession(f"s{i}", f"t{i}"), 1))
        q.select(budget=64, max_seqs=8, skip=lambda c: False)
    time.sleep(0.1)  # past 60 x idle_reset_s
    q.push(_call(FakeSession("sn", "new"), 1))  # nobody else active: counters restart
    q.select(budget=64, max_seqs=8, skip=lambda c: False)
    assert set(q.charged) <= {"new"} and set(q.last_queued) <= {"new"} and set(q.served) <= {"new"}


def test_a_new_tenant_starts_level_with_tenants_whose_calls_are_running() -> None:
    """A new tenant arriving while the busy tenant's calls are all in the running forward (its
    queue momentarily empty) starts at the busy tenant's counter, not at 0."""
    q = FairQueue(quantum=512)
    busy, new = FakeSession("sb", "busy"), FakeSession("sn", "new")
    q.push(_call(busy, 400))
    q.select(budget=400, max_seqs=8, skip=lambda c: False)  # busy's queue is empty now
    assert sorted(_contended_decode_seats(q, new, busy)) == ["busy"] * 4 + ["new"] * 4


def test_weights_skew_the_share() -> None:
    q = FairQueue(quantum=16)
    heavy, light = FakeSession("sh", "heavy", weight=3.0), FakeSession("sl", "light", weight=1.0)
    for _ in range(50):
        q.push(_call(heavy, 200))
        q.push(_call(light, 200))
    served = {"heavy": 0, "light": 0}
    for _ in range(40):
        for call, n in q.select(budget=64, max_seqs=8, skip=lambda c: False):
            served[call.tenant] += n
            call.done += n
            if call.remaining:
                q.push(call, front=True)
    ratio = served["heavy"] / served["light"]
    assert 2.5 <= ratio <= 3.5, served


def _prefill_tokens(picked: list[tuple[PredCall, int]]) -> dict[str, int]:
    """Prefill tokens per account in one selected forward (calls of more than one token)."""
    out: dict[str, int] = {}
    for call, n in picked:
        if len(call.tokens) > 1:
            out[call.account] = out.get(call.account, 0) + n
    return out


def test_a_long_prompt_takes_its_accounts_fair_share_of_a_contended_step_and_all_alone() -> None:
    """Found by an attacker: hundreds of tokens of one account's long prompts rode in every
    forward another tenant's 8-token call waited for. While two accounts have work, each
    account's prefill in one forward is its fair share of the contended step; the rest stays
    queued with its position advanced. Alone, an account takes the whole budget."""
    q = FairQueue(quantum=4096, idle_reset_s=5.0)
    attacker, victim = FakeSession("sa", "attacker"), FakeSession("sv", "victim")
    long = _call(attacker, 3800)
    q.push(long)
    alone = q.select(budget=2048, max_seqs=64, skip=lambda c: False, step_tokens=256)
    assert alone == [(long, 2048)], "alone, an account gets the whole step"
    long.done += 2048
    q.push(long, front=True)
    q.push(_call(victim, 8))
    picked = q.select(budget=2048, max_seqs=64, skip=lambda c: False, step_tokens=256)
    assert _prefill_tokens(picked) == {"tenant:attacker": 128, "tenant:victim": 8}
    long.done += 128
    assert long.remaining == 3800 - 2048 - 128
    # The victim's next call is a round trip away: its account is still active, and the
    # attacker still gets only its share, not the whole step.
    q.push(long, front=True)
    assert q.select(budget=2048, max_seqs=64, skip=lambda c: False, step_tokens=256) == [(long, 128)]
    # Without a contended step (``step_tokens=None``) the budget alone bounds the chunk.
    q.push(long, front=True)
    q.push(_call(victim, 8))
    assert _prefill_tokens(q.select(budget=2048, max_seqs=64, skip=lambda c: False)) == {
        "tenant:attacker": 1624,
        "tenant:victim": 8,
    }


def test_contended_step_shares_follow_weights_and_two_tenants_of_one_account_share_one() -> None:
    """The budget is per ACCOUNT: two tenants of one person take one share between them, and
    the account weighs as its heaviest tenant (a second tenant adds no weight)."""
    q = FairQueue(quantum=4096, idle_reset_s=5.0)
    first = FakeSession("s1", "attacker-1", account="u1")
    second = FakeSession("s2", "attacker-2", account="u1", weight=3.0)
    victim = FakeSession("sv", "victim", account="u2", weight=3.0)
    for s in (first, second, victim):
        q.push(_call(s, 3800))
    picked = q.select(budget=2048, max_seqs=64, skip=lambda c: False, step_tokens=256)
    assert _prefill_tokens(picked) == {"u1": 128, "u2": 128}, picked
    # Weights skew the share: 3 against 1 gives 192 (the pool's ceiling: 3/4 of the step).
    q = FairQueue(quantum=4096, idle_reset_s=5.0)
    light = FakeSession("sl", "light", account="u3")
    q.push(_call(light, 3800))
    q.push(_call(victim, 3800))
    assert _prefill_tokens(q.select(budget=2048, max_seqs=64, skip=lambda c: False, step_tokens=256)) == {
        "u3": 64,
        "u2": 192,
    }
    # One account's two tenants alone are not contended: they fill the budget together.
    q = FairQueue(quantum=4096, idle_reset_s=5.0)
    q.push(_call(first, 3800))
    q.push(_call(second, 3800))
    assert _prefill_tokens(q.select(budget=2048, max_seqs=64, skip=lambda c: False, step_tokens=256)) == {"u1": 2048}


def test_the_contended_step_is_sized_from_measured_forward_cost(tmp_path: Path) -> None:
    """``contended_step_tokens``: configured, or the tokens a forward can add and last at most
    ``contended_step_ratio`` decode-only forwards, by the measured cost, within [a 128th of the
    budget, the budget]; an eighth of the budget before anything was measured."""
    fs, io = make_fs(tmp_path, num_pages=64)
    config = SchedulerConfig(max_num_batched_tokens=2048, contended_step_ratio=2.0)
    scheduler = Scheduler(RecordingEngine(io), fs, config, max_model_len=200)
    assert scheduler.contended_step_tokens() == 256
    scheduler._measure_cost(0.010, tokens=3, items=3)  # decode-only: 10 ms
    assert scheduler.contended_step_tokens() == 256, "no per-token cost measured yet"
    scheduler._measure_cost(0.010 + 2048 * 0.0001, tokens=2048, items=1)  # 0.1 ms a token
    assert scheduler.contended_step_tokens() == 100  # (2 - 1) x 10 ms / 0.1 ms
    scheduler._measure_cost(0.010 + 32 * 0.01, tokens=32, items=1)  # too small a sample: ignored
    assert scheduler.contended_step_tokens() == 100
    # A forward slowed by whatever shared the machine with it does not shrink the step: the
    # fastest recent sample of each cost is the cost.
    scheduler._measure_cost(0.050, tokens=3, items=3)
    scheduler._measure_cost(0.010 + 2048 * 0.001, tokens=2048, items=1)
    assert scheduler.contended_step_tokens() == 100
    scheduler.metrics.prefill_samples.clear()
    scheduler.metrics.prefill_samples.append((2048, 0.010 + 2048 * 0.1))  # a token costs 10 decode forwards
    assert scheduler.contended_step_tokens() == 16, "the floor: a 128th of the budget"
    scheduler.metrics.prefill_samples.append((2048, 0.010 + 2048 * 1e-9))  # a GPU-like cost: the whole budget
    assert scheduler.contended_step_tokens() == 2048
    fixed = Scheduler(RecordingEngine(io), fs, SchedulerConfig(contended_step_tokens=300), max_model_len=200)
    assert fixed.contended_step_tokens() == 300


def test_a_prompt_chunk_is_priced_against_the_decode_floor_when_the_step_is_sized(tmp_path: Path) -> None:
    """A new worker's first decode forwards are slow; a prompt chunk measured then must not keep
    the near-zero token cost it had against them once decode forwards are fast (it grew the
    step to 500-680 tokens on a loaded host, and a contended forward lasted about four
    decode forwards, not two)."""
    fs, io = make_fs(tmp_path, num_pages=64)
    config = SchedulerConfig(max_num_batched_tokens=2048, contended_step_ratio=2.0)
    scheduler = Scheduler(RecordingEngine(io), fs, config, max_model_len=200)
    scheduler._measure_cost(0.030, tokens=1, items=1)  # a cold first decode forward: 30 ms
    scheduler._measure_cost(0.031, tokens=256, items=1)  # 256 prompt tokens in 31 ms
    scheduler._measure_cost(0.005, tokens=1, items=1)  # warm decode forwards: 5 ms
    scheduler._measure_cost(0.005, tokens=2, items=2)
    per_token = (0.031 - 0.005) / 256
    assert scheduler.metrics.token_cost() == pytest.approx(per_token)
    assert scheduler.contended_step_tokens() == int(0.005 / per_token)  # 49, not 1,280


# ------------------------------------------------------------------------------ Scheduler
@pytest.fixture
def sched(tmp_path: Path):
    fs, io = make_fs(tmp_path, num_pages=64)
    engine = RecordingEngine(io)
    # Wait up to one whole forward (capped at 0.2 s): these tests check who is waited for, the
    # proportional bound has its own test; the whole budget is one contended step (an eighth of
    # 32 tokens would split these tests' two-token prompts, the contended step has its own tests).
    config = SchedulerConfig(
        max_num_batched_tokens=32,
        max_num_seqs=8,
        max_batch_wait_s=0.2,
        batch_wait_fraction=1.0,
        contended_step_tokens=32,
    )
    s = Scheduler(engine, fs, config, max_model_len=200)
    yield s, fs, engine
    s.stop()


def test_one_forward_serves_calls_of_several_sessions_and_tenants(sched) -> None:
    scheduler, fs, engine = sched
    sessions = [FakeSession(f"s{i}", f"tenant{i % 2}") for i in range(4)]
    scheduler.active_sessions = lambda: [s.session_id for s in sessions]
    handles = [fs.create(s.owner) for s in sessions]
    calls = [PredCall(s, h, (10 + i, 20 + i), (1,)) for i, (s, h) in enumerate(zip(sessions, handles, strict=True))]
    futures = [scheduler.submit(call) for call in calls]
    scheduler.start()
    results = [f.result(timeout=10) for f in futures]
    assert len(engine.batches) == 1, "the bounded wait should have gathered all four sessions"
    # What each call's trace span says of the forward it rode in: counts of the whole batch,
    # and its own share of the forward's time (2 of its 8 tokens).
    for call in calls:
        assert (call.forwards, call.batch_size, call.batch_tokens, call.own_tokens) == (1, 4, 8, 2)
        assert call.forward_s > 0 and abs(call.forward_share_s - call.forward_s / 4) < 1e-9
    assert {item.seq_id for item in engine.batches[0].items} == {
        fs._handles.get(s.owner, h).file.seq_id for s, h in zip(sessions, handles, strict=True)
    }
    snap = scheduler.snapshot()
    assert snap["max_sessions_in_forward"] == 4 and snap["multi_session_forwards"] == 1
    for i, logits in enumerate(results):
        assert int(logits[0].argmax()) == (20 + i + 1) % VOCAB  # token 20+i at position 1
    assert [s.tokens for s in sessions] == [2, 2, 2, 2]


def test_a_task_whose_waiter_went_away_is_skipped_and_the_engine_goes_on(sched) -> None:
    """``run_on_engine``'s future is cancelled when its awaiting coroutine is (a swap-out whose
    session ended): settling it then would raise on the engine thread and stop every forward."""
    scheduler, fs, _engine = sched
    gone = scheduler.run_on_engine(lambda: "never")
    assert gone.cancel()
    kept = scheduler.run_on_engine(lambda: "ran")
    session = FakeSession("s", "t")
    scheduler.active_sessions = lambda: [session.session_id]
    pred = scheduler.submit(PredCall(session, fs.create(session.owner), (1, 2), (1,)))
    scheduler.start()
    assert kept.result(timeout=10) == "ran" and gone.cancelled()
    assert int(pred.result(timeout=10)[0].argmax()) == (2 + 1) % VOCAB


def test_a_session_with_many_threads_is_batched_whole(sched) -> None:
    """One LIP decoding 4 forks from 4 threads: after its first forward, the scheduler waits
    for all 4 calls (they arrive a little apart, as threads do) instead of launching part-full."""
    scheduler, fs, engine = sched
    engine.forward_s = 0.03
    wide = FakeSession("wide", "t")
    scheduler.active_sessions = lambda: [wide.session_id]
    handles = [fs.create(wide.owner) for _ in range(4)]
    first = [scheduler.submit(PredCall(wide, h, (1, 2), (1,))) for h in handles]
    scheduler.start()
    for f in first:
        f.result(timeout=10)
    for step in range(3):
        engine.batches.clear()
        futures = []

        def thread(h, i, futures=futures, step=step):
            time.sleep(0.002 * i)
            futures.append(scheduler.submit(PredCall(wide, h, (3 + step,), (0,))))

        workers = [threading.Thread(target=thread, args=(h, i)) for i, h in enumerate(handles)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        for f in futures:
            f.result(timeout=10)
        assert [len(b.items) for b in engine.batches] == [4], step


def test_a_batch_at_the_seq_cap_launches_without_waiting(sched) -> None:
    """With more calls queued than ``max_num_seqs`` the batch cannot grow: it launches at once,
    although some active session has not queued its call yet (the bounded wait is 0.2 s here),
    and the metrics say why and that demand exceeded the cap."""
    scheduler, fs, engine = sched
    sessions = [FakeSession(f"s{i}", f"tenant{i % 3}") for i in range(10)]
    scheduler.active_sessions = lambda: [s.session_id for s in sessions] + ["never-sends"]
    handles = [fs.create(s.owner) for s in sessions]
    futures = [scheduler.submit(PredCall(s, h, (5,), (0,))) for s, h in zip(sessions, handles, strict=True)]
    started = time.monotonic()
    scheduler.start()
    for f in futures:
        f.result(timeout=10)
    assert len(engine.batches[0].items) == 8
    snap = scheduler.snapshot()
    assert snap["launch_reasons"].get("seqs_full") == 1, snap["launch_reasons"]
    assert snap["forwards_seq_capped"] == 1
    # Per tenant: nothing left queued, and each virtual counter is the tokens it was served
    # (weight 1): tenant0 had four one-token calls, the others three.
    assert snap["queued_calls_per_tenant"] == {}
    assert snap["served_per_tenant"] == {"tenant0": 4.0, "tenant1": 3.0, "tenant2": 3.0}
    # The leftover two calls wait at most one bound; the first forward did not wait at all.
    assert time.monotonic() - started < 0.2 + 0.15


def test_an_idle_connected_session_does_not_hold_the_batch(sched) -> None:
    """A connected session that sends nothing (a LIP thinking in Python, or done and not yet
    disconnected) is not waited for: the busy session's calls launch as soon as they are in."""
    scheduler, fs, engine = sched
    engine.forward_s = 0.05
    busy, idle = FakeSession("busy", "a"), FakeSession("idle", "b")
    scheduler.active_sessions = lambda: [busy.session_id, idle.session_id]
    h = fs.create(busy.owner)
    scheduler.start()
    for step in range(6):
        scheduler.submit(PredCall(busy, h, (1 + step,), (0,))).result(timeout=10)
    reasons = scheduler.snapshot()["launch_reasons"]
    assert reasons.get("bound", 0) == 0 and reasons.get("all_ready") == 6, reasons


def _argmax(logits: torch.Tensor, step: int) -> int:
    return int(logits.argmax())


def test_a_multi_step_call_decodes_in_the_worker_without_waiting_for_its_program(sched) -> None:
    """``pred(steps=5)``: each chosen token goes straight back into the queue and rides the next
    forward, batched with another session's one-token calls; no forward waits out the bound for
    it (its program sends nothing between steps). The progress callback sees every token but the
    last; the file holds the prompt and every chosen token but the last; the appended tokens are
    metered and leave the call's reservation as they land."""
    scheduler, fs, engine = sched
    engine.forward_s = 0.01
    stepping, other, idle = FakeSession("stepping", "a"), FakeSession("other", "b"), FakeSession("idle", "c")
    scheduler.active_sessions = lambda: [stepping.session_id, idle.session_id]
    hs = fs.create(stepping.owner)
    progressed: list[int] = []
    call = PredCall(stepping, hs, (3, 4), (1,), choose=_argmax, steps=5, on_token=progressed.append)
    call.reserved = 2 + 4
    future = scheduler.submit(call)
    others = [scheduler.submit(PredCall(other, fs.create(other.owner), (7 + i,), (0,))) for i in range(3)]
    scheduler.start()
    got = future.result(timeout=10)
    for f in others:
        f.result(timeout=10)
    want, tok = [], 4
    for pos in range(1, 6):  # the fake logits: argmax (token + position) % VOCAB
        tok = (tok + pos) % VOCAB
        want.append(tok)
    assert got == want and progressed == want[:-1]
    assert fs.tokens(stepping.owner, hs) == [3, 4, *want[:-1]]
    assert stepping.tokens == 2 + 4 and stepping.unreserved == 2 + 3 and call.reserved == 1
    # Each step shares a forward with one of the other tenant's calls (the contended-seat cap
    # gives it as many seats as this tenant's one) until those are done.
    assert [len(b.items) for b in engine.batches] == [2, 2, 2, 1, 1]
    reasons = scheduler.snapshot()["launch_reasons"]
    assert reasons.get("bound", 0) == 0, reasons


def test_a_stop_token_or_a_full_context_ends_a_multi_step_call_with_what_it_chose(sched) -> None:
    scheduler, fs, _engine = sched
    s = FakeSession("s", "t")
    scheduler.active_sessions = lambda: [s.session_id]
    scheduler.start()
    h = fs.create(s.owner)
    # From token 4 at position 1: 5, 7, 10, ... (the fake logits); 7 is a stop token.
    assert scheduler.submit(PredCall(s, h, (3, 4), (1,), choose=_argmax, steps=9, stop=frozenset({7}))).result(
        timeout=10
    ) == [5, 7]
    full = fs.create(s.owner)
    scheduler.submit(PredCall(s, full, tuple(range(1, 197)), (195,))).result(timeout=10)
    got = scheduler.submit(PredCall(s, full, (9,), (0,), choose=_argmax, steps=20)).result(timeout=10)
    assert len(got) == 4 and len(fs.tokens(s.owner, full)) == 200, "ends at max_model_len 200, no error"
    with pytest.raises(ContextFull):
        scheduler.submit(PredCall(s, full, (got[-1],), (0,), choose=_argmax, steps=20)).result(timeout=10)


def test_a_cancelled_multi_step_call_stops_stepping(sched) -> None:
    """A call whose waiter gave up (deadline, closed connection) is not put back in the queue."""
    scheduler, fs, engine = sched
    engine.forward_s = 0.02
    s = FakeSession("s", "t")
    scheduler.active_sessions = lambda: [s.session_id]
    scheduler.start()
    seen = threading.Event()
    call = PredCall(s, fs.create(s.owner), (3,), (0,), choose=_argmax, steps=100, on_token=lambda t: seen.set())
    future = scheduler.submit(call)
    assert seen.wait(10)
    future.cancel()
    time.sleep(0.2)
    forwards = len(engine.batches)
    time.sleep(0.2)
    assert len(engine.batches) == forwards < 50


def test_the_bounded_wait_is_a_fraction_of_the_forward_time(tmp_path: Path) -> None:
    """A session of the last forward that stops sending costs one bounded wait: a quarter of a
    200 ms forward here (about 50 ms), not the 1 s cap."""
    fs, io = make_fs(tmp_path, num_pages=64)
    engine = RecordingEngine(io, forward_s=0.2)
    config = SchedulerConfig(max_num_batched_tokens=32, max_num_seqs=8, max_batch_wait_s=1.0, batch_wait_fraction=0.25)
    scheduler = Scheduler(engine, fs, config, max_model_len=200)
    gone, stays = FakeSession("gone", "a"), FakeSession("stays", "b")
    scheduler.active_sessions = lambda: [gone.session_id, stays.session_id]
    hg, hs = fs.create(gone.owner), fs.create(stays.owner)
    scheduler.start()
    try:
        first = [scheduler.submit(PredCall(s, h, (1, 2), (1,))) for s, h in ((gone, hg), (stays, hs))]
        for f in first:
            f.result(timeout=10)
        started = time.monotonic()
        scheduler.submit(PredCall(stays, hs, (3,), (0,))).result(timeout=10)
        elapsed = time.monotonic() - started - 0.2  # minus the forward itself
    finally:
        scheduler.stop()
    assert scheduler.snapshot()["launch_reasons"].get("bound") == 1
    assert 0.04 <= elapsed < 0.15, elapsed  # a whole forward (the old bound) would be 0.2


def test_long_prefill_is_chunked_under_the_token_budget_and_lands_intact(sched) -> None:
    scheduler, fs, engine = sched
    s = FakeSession("s0", "t")
    scheduler.active_sessions = lambda: [s.session_id]
    h = fs.create(s.owner)
    prompt = tuple(range(1, 101))  # 100 tokens, budget 32 per forward
    scheduler.start()
    (logits,) = scheduler.submit(PredCall(s, h, prompt, (99,))).result(timeout=10)
    assert [b.num_tokens for b in engine.batches] == [32, 32, 32, 4]
    assert int(logits.argmax()) == (100 + 99) % VOCAB
    assert fs.tokens(s.owner, h) == list(prompt)
    # every token's KV is where the next forward will read it
    file = fs._handles.get(s.owner, h).file
    got = [float(engine.io.pages[file.pages[p // BLOCK], 0, p % BLOCK, 0]) for p in range(100)]
    assert got == [float(t * 1000 + p) for p, t in enumerate(prompt)]


def test_a_prompt_past_max_model_len_fails_before_any_chunk_lands(sched) -> None:
    """``pred`` does not pre-check the length: the scheduler checks the whole call at its first
    chunk, so a 210-token prompt (limit 200, budget 32 per forward) leaves the file untouched."""
    scheduler, fs, engine = sched
    s = FakeSession("s0", "t")
    scheduler.active_sessions = lambda: [s.session_id]
    h = fs.create(s.owner)
    scheduler.start()
    scheduler.submit(PredCall(s, h, (1, 2, 3), (2,))).result(timeout=10)
    engine.batches.clear()
    with pytest.raises(ContextFull, match="210 tokens > 200"):
        scheduler.submit(PredCall(s, h, tuple(range(1, 208)), (206,))).result(timeout=10)
    assert engine.batches == [] and fs.tokens(s.owner, h) == [1, 2, 3]
    scheduler.submit(PredCall(s, h, tuple(range(4, 201)), (196,))).result(timeout=10)
    assert fs.length(s.owner, h) == 200, "a call that fills the limit exactly still runs"


def test_decodes_are_not_starved_by_a_long_prefill(sched) -> None:
    scheduler, fs, engine = sched
    long_s, short_s = FakeSession("long", "a"), FakeSession("short", "b")
    scheduler.active_sessions = lambda: [long_s.session_id, short_s.session_id]
    h_long, h_short = fs.create(long_s.owner), fs.create(short_s.owner)
    scheduler.start()
    scheduler.submit(PredCall(short_s, h_short, (5, 6, 7), (2,))).result(timeout=10)
    engine.batches.clear()
    big = scheduler.submit(PredCall(long_s, h_long, tuple(range(1, 161)), (159,)))
    decode = scheduler.submit(PredCall(short_s, h_short, (8,), (0,)))
    decode.result(timeout=10)
    big.result(timeout=10)
    first_with_decode = next(
        i for i, b in enumerate(engine.batches) if any(it.num_computed_tokens == 3 for it in b.items)
    )
    assert first_with_decode <= 1, "a decode waited behind more than one prefill chunk"
    assert all(b.num_tokens <= 32 for b in engine.batches)
    snap = scheduler.snapshot()
    assert 0 < snap["queue_wait_ms_max_decode"] <= snap["queue_wait_ms_max"]
    assert 0 < snap["gap_ms_avg"] < 1000, "back-to-back forwards leave a short, measured gap"
    assert snap["forward_ms_max"] >= snap["forward_ms_avg"] > 0


def test_a_failing_forward_fails_only_its_calls_and_keeps_kv_consistent(sched) -> None:
    scheduler, fs, engine = sched
    s = FakeSession("s0", "t")
    scheduler.active_sessions = lambda: [s.session_id]
    h = fs.create(s.owner)
    real_forward = engine.forward
    calls = {"n": 0}

    def flaky(batch: Batch) -> list[torch.Tensor]:
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("device fault")
        return real_forward(batch)

    engine.forward = flaky
    scheduler.start()
    scheduler.submit(PredCall(s, h, (1, 2, 3), (2,))).result(timeout=10)
    with pytest.raises(Exception, match="forward failed"):
        scheduler.submit(PredCall(s, h, (4,), (0,))).result(timeout=10)
    assert fs.length(s.owner, h) == 3, "an aborted append must not change the file"
    (logits,) = scheduler.submit(PredCall(s, h, (4,), (0,))).result(timeout=10)
    assert int(logits.argmax()) == (4 + 3) % VOCAB
    fs.check()


# --------------------------------------------------------------- real engine, subprocess
REAL_ENGINE_SCRIPT = textwrap.dedent(
    """
    import json, sys, threading
    import torch
    from gpu_worker.config import SchedulerConfig
    from gpu_worker.engine import Engine, EngineConfig
    from gpu_worker.kvfs import KVFS, LocalKVStore, Owner
    from gpu_worker.scheduler import PredCall, Scheduler
    from gpu_worker.tracing import SessionTrace
    from gpu_worker.usage import Usage

    class S:
        def __init__(self, sid, tenant):
            self.session_id, self.tenant, self.run_id, self.account = sid, tenant, "r", tenant
            self.owner, self.weight, self.swapped = Owner(tenant, sid), 1.0, False
            self.usage = Usage()
            self.trace = SessionTrace()
        def on_tokens(self, n, prefill=None):
            pass

        def on_cached_tokens(self, n):
            self.usage.cached_tokens += n

    model_dir, store = sys.argv[1], sys.argv[2]
    engine = Engine(EngineConfig(model_dir=model_dir, dtype="float32", num_pages=32, max_model_len=512))
    fs = KVFS(engine.num_pages, engine.block_size, engine.page_bytes, engine, LocalKVStore(store))
    sched = Scheduler(engine, fs, SchedulerConfig(max_num_batched_tokens=512, max_batch_wait_s=0.5), 512)
    prompts = [[(13 * i + 7 * j) % 5000 + 20 for j in range(40 + 9 * i)] for i in range(4)]
    sessions = [S(f"s{i}", f"t{i % 2}") for i in range(4)]

    def generate(together):
        sched.active_sessions = (lambda: [s.session_id for s in sessions]) if together else (lambda: [])
        handles = [fs.create(s.owner) for s in sessions]
        outs = [[] for _ in sessions]
        def one(i):
            toks = prompts[i]
            for _ in range(6):
                (logits,) = sched.submit(PredCall(sessions[i], handles[i], tuple(toks), (len(toks) - 1,))).result(60)
                nxt = int(logits[0].argmax())
                outs[i].append(nxt)
                toks = [nxt]
        if together:
            threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
            [t.start() for t in threads]
            [t.join() for t in threads]
        else:
            for i in range(4):
                one(i)
        for s, h in zip(sessions, handles):
            fs.close(s.owner, h)
        return outs

    sched.start()
    solo = generate(False)
    before = sched.snapshot()["multi_session_forwards"]
    together = generate(True)
    snap = sched.snapshot()
    sched.stop()
    engine.close()
    print(json.dumps({"solo": solo, "together": together, "max_sessions": snap["max_sessions_in_forward"],
                      "multi_before": before, "multi_after": snap["multi_session_forwards"]}))
    """
)


@pytest.mark.vllm
@pytest.mark.integration
def test_real_engine_batches_sessions_and_matches_solo_runs(default_model_dir: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", REAL_ENGINE_SCRIPT, str(default_model_dir), str(tmp_path / "store")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["multi_before"] == 0, "solo runs must not share forwards"
    assert out["multi_after"] > 0 and out["max_sessions"] >= 2, out
    assert out["together"] == out["solo"], "batching changed what a session generated"


def test_a_fresh_files_first_pred_maps_the_cached_prefix_and_computes_only_the_tail(tmp_path: Path) -> None:
    """The second conversation with the same prompt computes only the tokens past its cached
    whole pages (chunked prefill included), gets the same logits, and meters them as cached."""
    fs, io = make_fs(tmp_path, num_pages=64, prefix_cache=True)
    engine = RecordingEngine(io)
    config = SchedulerConfig(max_num_batched_tokens=32, max_num_seqs=8, max_batch_wait_s=0.01)
    scheduler = Scheduler(engine, fs, config, max_model_len=200)
    first, second = FakeSession("s1", "a"), FakeSession("s2", "a")
    scheduler.active_sessions = lambda: [first.session_id, second.session_id]
    prompt = tuple(range(1, 51))  # 50 tokens: 12 full pages of 4, chunked over 2 forwards
    scheduler.start()
    try:
        h1 = fs.create(first.owner)
        want = scheduler.submit(PredCall(first, h1, prompt, (49,))).result(timeout=10)
        engine.batches.clear()
        h2 = fs.create(second.owner)
        got = scheduler.submit(PredCall(second, h2, prompt, (49,))).result(timeout=10)
        assert torch.equal(got[0], want[0])
        computed = [t for b in engine.batches for item in b.items for t in item.new_token_ids]
        assert computed == list(prompt[48:])  # only the partial last page's tokens
        assert engine.batches[0].items[0].num_computed_tokens == 48
        assert second.usage.cached_tokens == 48 and second.tokens == 2
        assert scheduler.snapshot()["prefix_cached_tokens"] == 48
        # A row asked inside the cached prefix caps the mapping there.
        engine.batches.clear()
        third = FakeSession("s3", "a")
        h3 = fs.create(third.owner)
        scheduler.submit(PredCall(third, h3, prompt, (9, 49))).result(timeout=10)
        assert engine.batches[0].items[0].num_computed_tokens == 8
    finally:
        scheduler.stop()
    fs.check()


def test_engine_time_splits_busy_idle_with_work_and_idle_empty(tmp_path: Path) -> None:
    """``stats`` splits the engine's wall time: a multi-step call keeps it busy (its steps need
    no program round trip, so no forward waits with work queued for more than the scheduler's
    own time), a quiet worker is idle and empty, and the three buckets sum to the wall time."""
    fs, io = make_fs(tmp_path, num_pages=64)
    engine = RecordingEngine(io, forward_s=0.02)
    config = SchedulerConfig(max_num_batched_tokens=32, max_num_seqs=8, max_batch_wait_s=0.2)
    scheduler = Scheduler(engine, fs, config, max_model_len=200)
    s = FakeSession("s0", "t")
    scheduler.active_sessions = lambda: [s.session_id]
    h = fs.create(s.owner)
    began = time.monotonic()
    scheduler.start()
    try:
        time.sleep(0.3)  # nothing queued
        got = scheduler.submit(PredCall(s, h, (3, 4), (1,), choose=_argmax, steps=30)).result(timeout=10)
        assert len(got) == 30
        time.sleep(0.1)
        snap = scheduler.snapshot()
        wall = time.monotonic() - began
    finally:
        scheduler.stop()
    busy, work, empty = snap["busy_s"], snap["idle_with_work_queued_s"], snap["idle_empty_s"]
    assert abs(busy + work + empty - wall) < 0.05, snap
    assert busy >= 30 * 0.02, "every forward's time is busy"
    assert empty >= 0.35, "the quiet stretches before and after the call are idle and empty"
    assert work < busy / 2, f"the steps did not wait on the program: {snap}"
    assert snap["busy_fraction"] == pytest.approx(busy / (busy + work + empty), abs=0.01)


def test_a_prompt_goes_whole_only_when_nobody_else_waits_and_the_forward_holds_it() -> None:
    """Found by B13's random prompts: a 542-token prompt of the only tenant ran as three
    forwards (256 + 256 + 30, a DRR quantum each) although the budget held it whole, and each
    forward paid the model's fixed cost again. A longer prompt keeps its quantum chunks (short
    forwards for a tenant arriving meanwhile), and so do prompts of tenants sharing the pass."""
    q = FairQueue(quantum=256)
    a, b = FakeSession("sa", "a"), FakeSession("sb", "b")
    prompt = _call(a, 542)
    q.push(prompt)
    assert q.select(budget=2048, max_seqs=8, skip=lambda c: False) == [(prompt, 542)]

    long = _call(a, 3000)
    q.push(long)
    assert q.select(budget=2048, max_seqs=8, skip=lambda c: False) == [(long, 256)]

    first, second = _call(a, 300), _call(b, 300)
    q.push(first)
    q.push(second)
    picked = {c.tenant: n for c, n in q.select(budget=2048, max_seqs=8, skip=lambda c: False)}
    assert picked == {"a": 256, "b": 256}, picked
