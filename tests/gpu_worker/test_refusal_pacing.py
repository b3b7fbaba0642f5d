"""Repeated refusals of one account get their replies held (gpu_worker/refusal_pacing.py)."""

from __future__ import annotations

from gpu_worker.protocol import ErrorCode
from gpu_worker.refusal_pacing import RefusalPacer
from tests.plugins.clock import ManualClock


def test_the_first_refusals_are_free_then_the_hold_doubles_to_its_cap() -> None:
    clock = ManualClock()
    pacer = RefusalPacer(free=3, first_hold_s=0.01, most_hold_s=0.1, forget_after_s=2.0, clock=clock)
    holds = []
    for _ in range(9):
        holds.append(pacer.hold("acct", ErrorCode.BUSY))
        clock.now += 0.001
    assert holds == [0.0, 0.0, 0.0, 0.01, 0.02, 0.04, 0.08, 0.1, 0.1]
    assert pacer.stats()["held"] == 6


def test_a_pause_starts_the_count_again_and_a_success_does_not() -> None:
    clock = ManualClock()
    pacer = RefusalPacer(free=2, first_hold_s=0.01, forget_after_s=2.0, clock=clock)
    for _ in range(4):
        pacer.hold("acct", ErrorCode.NO_SPACE)
    assert pacer.hold("acct", ErrorCode.NO_SPACE) > 0
    clock.now += 2.5  # a pause longer than forget_after_s
    assert pacer.hold("acct", ErrorCode.NO_SPACE) == 0.0


def test_accounts_are_paced_apart_and_only_resource_refusals_count() -> None:
    clock = ManualClock()
    pacer = RefusalPacer(free=1, clock=clock)
    assert pacer.hold("attacker", ErrorCode.BUSY) == 0.0
    assert pacer.hold("attacker", ErrorCode.QUOTA) > 0
    assert pacer.hold("other", ErrorCode.BUSY) == 0.0  # another account's first refusal
    # An invalid argument or a missing file is an answer about the request: never held.
    for _ in range(10):
        assert pacer.hold("prober", ErrorCode.BAD_ARGS) == 0.0
        assert pacer.hold("prober", ErrorCode.NOT_FOUND) == 0.0


def test_ended_streaks_are_forgotten() -> None:
    clock = ManualClock()
    pacer = RefusalPacer(clock=clock)
    for i in range(100):
        pacer.hold(f"a{i}", ErrorCode.BUSY)
    clock.now += 10
    pacer.hold("late", ErrorCode.BUSY)
    assert pacer.stats()["accounts"] == 1
