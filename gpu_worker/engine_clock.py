"""Where the engine's wall time goes: forwards, idle with work queued, idle with nothing to do.

The scheduler's ``gap_ms_avg`` says how long the engine idles between two forwards, but not
whether anything could have run in that gap: under saturation (calls queued beyond the batch)
every millisecond between forwards is throughput lost to the scheduler and the program round
trip; on a worker whose programs are all thinking it is nothing. This clock splits the wall time
since the worker started into three buckets that always sum to it:

* ``busy``: inside ``Engine.forward``;
* ``work``: not in a forward while at least one call is queued or in the engine thread's hands
  (picked for the next batch, or the last forward's results being committed while a call waits);
* ``empty``: not in a forward and nothing to run.

The time after a forward (committing, picking tokens, settling calls) is held in a fourth,
provisional state and charged, when the engine thread is done with it, to ``work`` if a call is
queued by then and to ``empty`` otherwise: it is the scheduler's cost only where it delays a
forward that could run. A call that arrives in the middle of it charges all of it to ``work``
(conservative: the figure errs towards more idle-with-work, never less).

``batch_wait`` is the part of ``work`` the scheduler spent waiting on purpose for a fuller batch
(``Scheduler._wait_for_fuller_batch``): a policy, not an overhead, but still the engine waiting
on programs while work is queued, so it stays inside ``work``.

Thread-safety: every transition is made with the scheduler's condition held (the engine thread
and ``Scheduler.submit`` both take it), so the clock has no lock of its own.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Literal

State = Literal["busy", "work", "empty", "post"]


@dataclass
class EngineClock:
    """Integrates the engine's state over time (see the module docstring)."""

    #: When the open interval (in ``state``) began.
    since: float = field(default_factory=time.monotonic)
    state: State = "empty"
    busy_s: float = 0.0
    work_s: float = 0.0
    empty_s: float = 0.0
    #: The open ``post`` interval's time so far, and whether a call arrived during it.
    post_s: float = 0.0
    post_had_work: bool = False
    batch_wait_s: float = 0.0

    def _close(self, at: float) -> None:
        elapsed = max(at - self.since, 0.0)
        if self.state == "busy":
            self.busy_s += elapsed
        elif self.state == "work":
            self.work_s += elapsed
        elif self.state == "empty":
            self.empty_s += elapsed
        else:
            self.post_s += elapsed
        self.since = at

    def to(self, state: State, at: float | None = None) -> None:
        """Enter ``state`` (a no-op if already in it)."""
        if state == self.state:
            return
        self._close(time.monotonic() if at is None else at)
        self.state = state

    def work_arrived(self) -> None:
        """A call was queued: an idle engine now has work (a forward or its results stay so)."""
        if self.state == "empty":
            self.to("work")
        elif self.state == "post":
            self.post_had_work = True

    def post_done(self, has_work: bool, at: float | None = None) -> None:
        """The engine thread finished a forward's results: charge that time to ``work`` if a
        call was queued by then (or arrived meanwhile), else to ``empty``, and go on in it."""
        if self.state != "post":
            return
        at = time.monotonic() if at is None else at
        self._close(at)
        has_work = has_work or self.post_had_work
        if has_work:
            self.work_s += self.post_s
        else:
            self.empty_s += self.post_s
        self.post_s = 0.0
        self.post_had_work = False
        self.state = "work" if has_work else "empty"

    def waited_for_batch(self, seconds: float) -> None:
        self.batch_wait_s += max(seconds, 0.0)

    def totals(self, at: float | None = None) -> dict[str, float]:
        """Seconds in each bucket up to ``at`` (now), the open interval included; a forward's
        results still being handled count as ``work`` (they are, if anything is queued)."""
        at = time.monotonic() if at is None else at
        busy, work, empty = self.busy_s, self.work_s, self.empty_s
        open_s = max(at - self.since, 0.0)
        if self.state == "busy":
            busy += open_s
        elif self.state == "empty":
            empty += open_s
        else:
            work += open_s + (self.post_s if self.state == "post" else 0.0)
        return {"busy_s": busy, "idle_with_work_queued_s": work, "idle_empty_s": empty}

    def to_dict(self) -> dict[str, float]:
        """The three buckets, the deliberate batch wait, and shares of the wall time: the
        engine's busy fraction and its idle-with-work fraction (the per-token tax under load),
        also as a share of the time work was present (busy + idle with work)."""
        t = self.totals()
        wall = sum(t.values())
        loaded = t["busy_s"] + t["idle_with_work_queued_s"]
        return {
            **{k: round(v, 4) for k, v in t.items()},
            "batch_wait_s": round(self.batch_wait_s, 4),
            "busy_fraction": round(t["busy_s"] / wall, 4) if wall > 0 else 0.0,
            "idle_with_work_fraction": round(t["idle_with_work_queued_s"] / wall, 4) if wall > 0 else 0.0,
            "idle_with_work_share_of_loaded": round(t["idle_with_work_queued_s"] / loaded, 4) if loaded > 0 else 0.0,
        }
