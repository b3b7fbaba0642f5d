"""Refusals of one account, asked for again and again, get their replies held.

Why: every call a program makes costs the worker's event loop (one thread, shared by every
tenant's sessions, and holding the interpreter lock the engine thread's forward also needs) the
same few hundred microseconds to read, decode, check and answer, whether it succeeds or is
refused. A refusal costs the caller nothing but a round trip, so a program that retries it in a
tight loop spends the shared loop as fast as it can ask: in the account soak one grammar call
refused by the compile back-off was asked ~800 times a second (37,699 refusals in ~45 s), and
the worker's loop held the interpreter lock about as often as the engine thread did. Whatever the
next budget is, a refusal must not be cheaper to ask for than to answer.

How: per account (the tenants of one person together, as every other per-account bound), the
pacer counts refusals that follow each other within ``forget_after_s``. The first ``free`` are
answered at once: a program that meets a bound and backs off on its own never waits. Past them
each reply is held ``first_hold_s``, doubling with every further refusal up to ``most_hold_s``;
a pause of ``forget_after_s`` without a refusal starts the count again. A successful call does
not reset it (a cheap success between refusals would otherwise buy a free burst). The caller
sees the same error, later; a held reply keeps its request's in-flight slot, so a connection
holds at most its in-flight cap of them and the reader stops taking requests past that.

Which refusals: the shared bounds a program meets by asking too much (``PACED_CODES``: busy, no
space, quota, a channel full or at its limit), where retrying is the natural reaction and asking
again at once cannot succeed. Not an invalid argument or a missing file (an answer about the
request itself, which a fuzzing client or a probing program expects at once; a client past its
in-flight cap gets EBUSY, which is paced), nor the answers of normal control flow (a closed
channel, a receive that timed out).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from gpu_worker.protocol import ErrorCode

#: Error codes whose replies are paced (see the module docstring).
PACED_CODES = frozenset(
    {
        ErrorCode.BUSY,
        ErrorCode.NO_SPACE,
        ErrorCode.QUOTA,
        ErrorCode.CHANNEL_FULL,
        ErrorCode.TOO_MANY_CHANNELS,
    }
)


@dataclass
class _Streak:
    refusals: int
    last_at: float


class RefusalPacer:
    """``hold(account, code)``: how long to hold the reply of a refusal about to be sent."""

    def __init__(
        self,
        free: int = 8,
        first_hold_s: float = 0.01,
        most_hold_s: float = 1.0,
        forget_after_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.free = free
        self.first_hold_s = first_hold_s
        self.most_hold_s = most_hold_s
        self.forget_after_s = forget_after_s
        self._clock = clock
        self._streaks: dict[str, _Streak] = {}
        #: Replies held, and their seconds together, since start (``stats``).
        self.held = 0
        self.held_s = 0.0

    def hold(self, account: str, code: str) -> float:
        """Record a refusal with ``code`` for ``account``; the seconds its reply should wait."""
        if code not in PACED_CODES:
            return 0.0
        now = self._clock()
        streak = self._streaks.get(account)
        if streak is None or now - streak.last_at > self.forget_after_s:
            streak = self._streaks[account] = _Streak(0, now)
            self._forget_old(now)
        streak.refusals += 1
        streak.last_at = now
        past = streak.refusals - self.free
        if past <= 0:
            return 0.0
        seconds = min(self.most_hold_s, self.first_hold_s * 2 ** min(past - 1, 30))
        self.held += 1
        self.held_s += seconds
        return seconds

    def _forget_old(self, now: float) -> None:
        """Drop the streaks that ended (called when one starts, so the table stays small)."""
        if len(self._streaks) > 64:
            for account in [a for a, s in self._streaks.items() if now - s.last_at > self.forget_after_s]:
                del self._streaks[account]

    def stats(self) -> dict[str, float]:
        return {"held": self.held, "held_s": round(self.held_s, 3), "accounts": len(self._streaks)}
