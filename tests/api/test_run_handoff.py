"""run_handoff: an in-process run's recorded outcome reaches the request waiting on it once,
only for runs this process dispatched, with the usage the view reads; bounded."""

from __future__ import annotations

import uuid

import pytest

from api.models import Run, UsageRecord
from api.services import run_handoff


def _recorded(status: str = "succeeded") -> tuple[Run, UsageRecord]:
    run = Run(id=uuid.uuid4(), status=status, result={"choices": [], "usage": {"prompt_tokens": 3}})
    return run, UsageRecord(prefill_tokens=3, cached_tokens=2)


def test_an_expected_run_is_taken_once_as_a_copy_with_its_usage():
    run, usage = _recorded()
    run_handoff.expect(run.pk)
    run_handoff.offer(run, usage)
    done = run_handoff.take(run.pk)
    assert done is not None and done is not run
    assert (done.pk, done.status, done.result) == (run.pk, "succeeded", run.result)
    assert done.usage.cached_tokens == 2
    assert run_handoff.take(run.pk) is None


def test_a_run_not_dispatched_here_is_not_kept():
    run, usage = _recorded()
    run_handoff.offer(run, usage)
    assert run_handoff.take(run.pk) is None


def test_a_second_record_of_a_taken_run_is_not_kept():
    run, usage = _recorded()
    run_handoff.expect(run.pk)
    run_handoff.offer(run, usage)
    assert run_handoff.take(run.pk) is not None
    run_handoff.offer(run, usage)  # finish_run again (a settle after a failure)
    assert run_handoff.take(run.pk) is None


def test_runs_whose_request_went_away_are_forgotten_oldest_first(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(run_handoff, "MAX_KEPT", 2)
    runs = [_recorded() for _ in range(3)]
    for run, usage in runs:
        run_handoff.expect(run.pk)
        run_handoff.offer(run, usage)
    assert run_handoff.take(runs[0][0].pk) is None
    assert [run_handoff.take(r.pk) is not None for r, _ in runs[1:]] == [True, True]


def test_a_request_waiting_on_an_in_process_run_wakes_when_it_is_recorded():
    """``recorded`` returns once ``finish_run`` offers the run (from the executor's thread), or
    False after its timeout; ``pending`` says whether waiting for it makes sense at all."""
    import asyncio
    import threading

    run, usage = _recorded()
    assert not run_handoff.pending(run.pk)
    run_handoff.expect(run.pk)
    assert run_handoff.pending(run.pk)

    async def scenario() -> tuple[bool, bool]:
        missed = await run_handoff.recorded(run.pk, 0.05)
        threading.Timer(0.05, run_handoff.offer, (run, usage)).start()
        woke = await run_handoff.recorded(run.pk, 5.0)
        return missed, woke

    missed, woke = asyncio.run(scenario())
    assert (missed, woke) == (False, True)
    assert run_handoff.pending(run.pk), "recorded, not taken yet"
    assert asyncio.run(run_handoff.recorded(run.pk, 0.01)), "an offer before the wait is seen at once"
    assert run_handoff.take(run.pk) is not None and not run_handoff.pending(run.pk)
    assert run_handoff._waiters == {}
