"""Units of one shared pool handed to accounts in turn: a fair queue across accounts.

The grammar compile processes were once bounded per *tenant* (one compile at a time each), so two
tenants of one person held both processes with slow compiles and a third tenant's first-time
schema waited out the 10 s budget behind them. Here the bound is per *account* and comes from the
pool's capacity (``resource_model.Pool``): one account holds at most ``pool.ceiling`` units (with
two units: one, never all), and when a unit frees, the waiting account that holds the fewest goes
first (an account that holds none before one that already has some), FIFO within an account and
by arrival among equals. A unit is granted at once whenever one is free and the ceiling allows,
so an idle pool is lent to whoever is busy up to the ceiling.

Runs on one event loop; stdlib only (``gpu_worker`` imports no Django).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from gpu_worker.resource_model import Pool


@dataclass(order=True)
class _Waiter:
    seq: int
    account: str = field(compare=False)
    future: asyncio.Future[None] = field(compare=False)


class AccountSlots:
    """``pool.capacity`` units; ``async with slots.hold(account):`` holds one of them."""

    def __init__(self, pool: Pool) -> None:
        if pool.ceiling < 1:
            raise ValueError(f"{pool.name}: a capacity of {pool.capacity} leaves no unit one account may hold")
        self.pool = pool
        self._free = pool.capacity
        self._held: Counter[str] = Counter()
        self._waiters: list[_Waiter] = []
        self._seq = itertools.count()

    def held(self, account: str) -> int:
        """Units ``account`` holds now."""
        return self._held[account]

    @property
    def waiting(self) -> int:
        """Requests queued for a unit."""
        return len(self._waiters)

    @contextlib.asynccontextmanager
    async def hold(self, account: str) -> AsyncIterator[None]:
        """Wait for a unit ``account`` may take, hold it for the block, then hand it on."""
        await self.acquire(account)
        try:
            yield
        finally:
            self.release(account)

    async def acquire(self, account: str) -> None:
        """Wait for a unit ``account`` may take; the caller owes one :meth:`release`."""
        waiter = _Waiter(next(self._seq), account, asyncio.get_running_loop().create_future())
        self._waiters.append(waiter)
        self._dispatch()
        try:
            await waiter.future
        except asyncio.CancelledError:
            if waiter.future.done() and not waiter.future.cancelled():
                self.release(account)  # granted just as its requester went away: hand it on
            else:
                self._waiters.remove(waiter)
            raise

    def release(self, account: str) -> None:
        """Hand back a unit ``account`` holds, to the next waiter the queue's order picks."""
        self._held[account] -= 1
        if self._held[account] <= 0:
            del self._held[account]
        self._free += 1
        self._dispatch()

    def _dispatch(self) -> None:
        """Grant free units while some waiter may take one: the account holding the fewest
        first, the oldest request among those."""
        while self._free > 0:
            eligible = [w for w in self._waiters if self._held[w.account] < self.pool.ceiling]
            if not eligible:
                return
            chosen = min(eligible, key=lambda w: (self._held[w.account], w.seq))
            self._waiters.remove(chosen)
            self._held[chosen.account] += 1
            self._free -= 1
            chosen.future.set_result(None)
