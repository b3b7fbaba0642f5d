"""A back-off per account after a grammar compile of theirs was killed for its time budget.

The compile processes are handed out per account (``account_slots``), so one account's grammar
bombs hold at most one of the two children; but they held it *all the time*: each bomb ran to
the 10 s budget, was killed, its replacement child started (an interpreter and xgrammar's
import), and the account's next never-seen schema took the fresh child at once. Measured in
the combined soak (tests/reliability/test_account_soak.py), that was about 0.4 of one of the
host's two cores, taken from everyone's requests, the engine's included.

So a kill opens a back-off for the account: until it ends, the account's *first-time* compiles
are refused at once with ``EBUSY`` naming the back-off (``grammar_kill_backoff_s``), before a
child is spent. Cached grammars and refusals still answer (a cache hit costs no child), and a
compile another account already started is shared as before. Each kill within
``backoff_max_s`` of the end of the previous back-off doubles the back-off, up to
``backoff_max_s``; a kill after a longer quiet time starts again from ``backoff_s``. With the defaults (20 s, then 40,
80, 160, 300) an account that only sends bombs keeps a child busy for 10 s of the first 30,
then ever less: a third, a fifth, a ninth, ... instead of all the time.

Runs on the worker's event loop; stdlib only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from gpu_worker.protocol import ErrorCode, ProtocolError


@dataclass
class _Streak:
    kills: int
    until: float


class CompileBackoff:
    """Per account: whether its first-time compiles are refused now, and for how long."""

    def __init__(self, backoff_s: float, backoff_max_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.backoff_s = backoff_s
        self.backoff_max_s = max(backoff_max_s, backoff_s)
        self._clock = clock
        self._streaks: dict[str, _Streak] = {}
        #: First-time compiles refused for a back-off (worker stats).
        self.refused = 0

    def killed(self, account: str) -> float:
        """Note that ``account``'s compile was killed for its budget; the back-off it opens (s)."""
        now = self._clock()
        self._forget_quiet(now)
        if self.backoff_s <= 0:
            return 0.0
        streak = self._streaks.get(account)
        kills = 1 if streak is None else streak.kills + 1
        wait = min(self.backoff_max_s, self.backoff_s * 2 ** (kills - 1))
        self._streaks[account] = _Streak(kills, now + wait)
        return wait

    def check(self, account: str) -> None:
        """``EBUSY`` naming the back-off while ``account``'s is open; nothing otherwise."""
        streak = self._streaks.get(account)
        if streak is None:
            return
        left = streak.until - self._clock()
        if left <= 0:
            return
        self.refused += 1
        raise ProtocolError(
            ErrorCode.BUSY,
            f"a grammar compile of this account ran past its time budget and was stopped: this "
            f"account's new grammars are refused for {left:.0f} s more (grammar_kill_backoff_s, "
            f"{streak.kills} stopped in a row); grammars compiled before still answer",
        )

    def _forget_quiet(self, now: float) -> None:
        """Drop the streaks of accounts quiet for longer than the longest back-off since theirs
        ended: their next kill starts again from ``backoff_s`` (and memory stays bounded)."""
        quiet = [a for a, s in self._streaks.items() if now - s.until > self.backoff_max_s]
        for account in quiet:
            del self._streaks[account]
