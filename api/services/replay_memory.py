"""The web process's memory for replays of finished runs' event streams, shared per *account*.

Why: a replay read its stream 100 entries at a time, and an entry may be 1 MiB, so one replay
whose client stopped reading held ~100 MB of this process until the client went; 32 such
replays held ~1 GB, and per-address caps let one person drive several tenants past that. Now a
replay reads pages of at most ``PAGE_BYTES`` (api/views/run_events.py) and holds at most
``SLOT_BYTES`` (the page being sent, the next entry, the server's write buffer); the process's
replays together are the pool ``PoolName.REPLAY_MEMORY_BYTES`` of ``SYMPHONY_REPLAY_MEMORY_BYTES``
(by default 1/16 of the memory this process may use: its cgroup limit, else the machine's;
web/settings.py),
and an account may hold ``fair_share`` of it among the accounts replaying in this process (alone,
the pool's ceiling). Past it the replay gets 429 ``throttled`` with ``Retry-After``. The memory
is per process, so the count is too (no Redis round trip).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from django.conf import settings

from gpu_worker.resource_model import Pool, PoolName

MIB = 1024 * 1024
#: Most bytes of entries one replay reads from Redis per round trip (one entry may pass it).
PAGE_BYTES = 1 * MIB
#: What one replay is counted as: a page, one entry (up to 1 MiB) past it, and what the server
#: holds of the page already sent (its write buffer takes a whole chunk before it waits).
SLOT_BYTES = 3 * PAGE_BYTES
RETRY_AFTER_S = 5


class ReplayMemoryFull(Exception):
    """The account holds its share of the replay pool (or the pool is full)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.retry_after = RETRY_AFTER_S


#: A slot whose replay has not started this long after it was taken is given back: a response
#: whose client left before it started streaming is never closed by Django.
START_GRACE_S = 30.0


@dataclass(eq=False)
class Slot:
    """One replay's claim on the pool: :meth:`started` when its stream starts, :meth:`release`
    when it ends (idempotent)."""

    account: str
    size: int
    taken_at: float = field(default_factory=time.monotonic)
    is_started: bool = False
    released: bool = False

    def started(self) -> None:
        self.is_started = True

    def release(self) -> None:
        _ledger.give_back(self)


class _Ledger:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.slots: set[Slot] = set()

    def pool(self) -> Pool:
        return Pool(PoolName.REPLAY_MEMORY_BYTES, settings.SYMPHONY_REPLAY_MEMORY_BYTES, min_reserve=SLOT_BYTES)

    def _held(self) -> dict[str, int]:
        now = time.monotonic()
        for slot in [s for s in self.slots if not s.is_started and now - s.taken_at > START_GRACE_S]:
            slot.released = True
            self.slots.discard(slot)
        held: dict[str, int] = {}
        for slot in self.slots:
            held[slot.account] = held.get(slot.account, 0) + slot.size
        return held

    def take(self, account: str) -> Slot:
        pool = self.pool()
        with self._lock:
            by_account = self._held()
            held = by_account.get(account, 0)
            accounts = len(by_account) + (0 if held else 1)
            share = pool.fair_share(1, accounts)
            total = sum(by_account.values())
            if held + SLOT_BYTES > share or total + SLOT_BYTES > pool.capacity:
                raise ReplayMemoryFull(
                    f"this account's replays of finished runs hold {held} bytes of this server's memory for"
                    f" replays and one more takes {SLOT_BYTES}: past its share of {share} (an equal share of"
                    f" the {pool.capacity} bytes among the {accounts} accounts replaying, at most"
                    f" {pool.ceiling}); finish or close a replay, or retry in {RETRY_AFTER_S} s"
                )
            slot = Slot(account, SLOT_BYTES)
            self.slots.add(slot)
        return slot

    def give_back(self, slot: Slot) -> None:
        with self._lock:
            slot.released = True
            self.slots.discard(slot)

    def total(self) -> int:
        with self._lock:
            return sum(self._held().values())


_ledger = _Ledger()


def take(account: str) -> Slot:
    """A slot of the replay pool for ``account``; :class:`ReplayMemoryFull` past its share."""
    return _ledger.take(account)


def held_bytes() -> int:
    """Bytes of the pool held now (all accounts)."""
    return _ledger.total()
