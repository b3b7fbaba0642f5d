"""The fair queue that hands out grammar compile processes per account (gpu_worker/account_slots.py).

Bounds come from the pool's capacity (``resource_model.Pool``): with 2 processes one account
holds 1, with 4 it holds 3; a waiting account that holds none goes before one that holds some,
FIFO within an account."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import pytest

from gpu_worker.account_slots import AccountSlots
from gpu_worker.resource_model import Pool, PoolName


def _slots(capacity: int) -> AccountSlots:
    return AccountSlots(Pool(PoolName.GRAMMAR_PROCESSES, capacity))


class _Holders:
    """Tasks that each hold a unit until released, recording the order they got one."""

    def __init__(self, slots: AccountSlots) -> None:
        self.slots = slots
        self.granted: list[str] = []
        self._release: dict[str, asyncio.Event] = {}
        self.tasks: dict[str, asyncio.Task] = {}

    async def start(self, name: str, account: str) -> None:
        self._release[name] = asyncio.Event()

        async def hold() -> None:
            async with self.slots.hold(account):
                self.granted.append(name)
                await self._release[name].wait()

        self.tasks[name] = asyncio.create_task(hold())
        await asyncio.sleep(0)  # queued (or granted) in call order

    async def release(self, name: str) -> None:
        self._release[name].set()
        await self.tasks[name]
        await asyncio.sleep(0)


def _run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), 5))


def test_one_account_of_two_processes_holds_one_and_another_account_gets_the_other() -> None:
    async def body() -> None:
        slots = _slots(2)
        h = _Holders(slots)
        await h.start("a1", "u1")
        await h.start("a2", "u1")  # the same account from another tenant: waits, a unit free or not
        await h.start("b1", "u2")
        assert h.granted == ["a1", "b1"]
        assert slots.held("u1") == 1 and slots.waiting == 1
        await h.release("a1")
        assert h.granted == ["a1", "b1", "a2"]
        await h.release("a2")
        await h.release("b1")
        assert slots.held("u1") == slots.held("u2") == 0

    _run(body)


def test_an_idle_pool_is_lent_up_to_the_ceiling_never_whole() -> None:
    async def body() -> None:
        slots = _slots(4)  # reserve 1, ceiling 3
        h = _Holders(slots)
        for i in range(4):
            await h.start(f"a{i}", "u1")
        assert h.granted == ["a0", "a1", "a2"]
        await h.start("b0", "u2")
        assert h.granted[-1] == "b0", "the reserved unit went to the other account at once"
        for name in ("a0", "a1", "a2", "a3", "b0"):
            await h.release(name)

    _run(body)


def test_a_waiting_account_that_holds_none_goes_before_earlier_requests_of_busier_ones() -> None:
    async def body() -> None:
        slots = _slots(4)  # ceiling 3
        h = _Holders(slots)
        for name in ("a0", "a1", "a2"):
            await h.start(name, "u1")
        await h.start("b0", "u2")  # the pool is full now
        await h.start("b1", "u2")  # queued first, but u2 already holds one
        await h.start("c0", "u3")  # queued last, holds none
        await h.release("a0")
        assert h.granted[-1] == "c0"
        await h.release("a1")
        assert h.granted[-1] == "b1"
        for name in ("a2", "b0", "b1", "c0"):
            await h.release(name)

    _run(body)


def test_requests_of_one_account_are_served_in_order() -> None:
    async def body() -> None:
        slots = _slots(2)
        h = _Holders(slots)
        await h.start("first", "u1")
        for i in range(3):
            await h.start(f"next{i}", "u1")
        for name in ("first", "next0", "next1"):
            await h.release(name)
        assert h.granted == ["first", "next0", "next1", "next2"]
        await h.release("next2")

    _run(body)


def test_a_request_that_goes_away_leaves_no_unit_behind() -> None:
    async def body() -> None:
        slots = _slots(2)
        h = _Holders(slots)
        await h.start("a0", "u1")
        await h.start("a1", "u1")
        h.tasks["a1"].cancel()  # gave up while queued
        with contextlib.suppress(asyncio.CancelledError):
            await h.tasks["a1"]
        assert slots.waiting == 0
        await h.start("a2", "u1")
        h._release["a0"].set()
        await asyncio.sleep(0)  # a0 leaves: a2 is granted, and cancelled before it runs
        h.tasks["a2"].cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await h.tasks["a2"]
        assert slots.held("u1") == 0
        await h.start("a3", "u1")
        await h.start("b0", "u2")
        assert h.granted[-2:] == ["a3", "b0"]
        await h.release("a3")
        await h.release("b0")

    _run(body)


def test_a_pool_with_no_unit_for_one_account_is_refused() -> None:
    with pytest.raises(ValueError, match="no unit one account may hold"):
        _slots(1)
