"""A clock the test moves by hand, for code that takes ``clock: Callable[[], float]``."""

from __future__ import annotations


class ManualClock:
    """Returns ``now``; a test sets or advances it."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
