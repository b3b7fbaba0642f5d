"""The engine clock's buckets (gpu_worker/engine_clock.py), on explicit timestamps: what each
transition charges where, and that the buckets always sum to the wall time."""

from __future__ import annotations

from gpu_worker.engine_clock import EngineClock


def _totals(clock: EngineClock, at: float) -> tuple[float, float, float]:
    t = clock.totals(at)
    return t["busy_s"], t["idle_with_work_queued_s"], t["idle_empty_s"]


def test_results_handled_while_a_call_waits_are_idle_with_work() -> None:
    clock = EngineClock(since=0.0)
    clock.to("work", at=1.0)  # a call arrives after 1 s of nothing
    clock.to("busy", at=1.5)  # 0.5 s of planning and batch wait
    clock.to("post", at=3.5)  # a 2 s forward
    clock.post_done(True, at=3.75)  # its results handled while another call was queued
    clock.to("busy", at=4.0)
    assert _totals(clock, 5.0) == (3.0, 1.0, 1.0)


def test_results_handled_with_nothing_queued_are_idle_empty() -> None:
    clock = EngineClock(since=0.0)
    clock.to("work", at=0.0)
    clock.to("busy", at=0.0)
    clock.to("post", at=1.0)
    clock.post_done(False, at=1.25)
    assert _totals(clock, 2.0) == (1.0, 0.0, 1.0)


def test_a_call_arriving_while_results_are_handled_charges_them_to_work() -> None:
    clock = EngineClock(since=0.0)
    clock.to("busy", at=0.0)
    clock.to("post", at=1.0)
    clock.work_arrived()
    clock.post_done(False, at=1.5)  # the call was picked up meanwhile: still counted
    assert clock.state == "work"
    assert _totals(clock, 1.5) == (1.0, 0.5, 0.0)


def test_work_arriving_at_a_busy_engine_changes_nothing() -> None:
    clock = EngineClock(since=0.0)
    clock.to("busy", at=0.0)
    clock.work_arrived()
    assert clock.state == "busy"
    busy, work, empty = _totals(clock, 2.0)
    assert (busy, work, empty) == (2.0, 0.0, 0.0)


def test_fractions_sum_to_the_wall_time() -> None:
    clock = EngineClock(since=0.0)
    clock.to("busy", at=0.0)
    clock.to("post", at=3.0)
    clock.post_done(True, at=4.0)
    t = clock.totals(4.0)
    assert sum(t.values()) == 4.0
    assert t == {"busy_s": 3.0, "idle_with_work_queued_s": 1.0, "idle_empty_s": 0.0}
