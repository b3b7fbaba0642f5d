"""Back-pressure: at most ``cap`` calls in flight on a connection, the rest wait their turn.

The worker answers a call past its in-flight caps (64 a connection, 64 ``pred`` a session) with
``EBUSY``. A LIP that runs hundreds of threads on one connection should not see that: its calls
wait here until a reply frees a slot, and a thread that waits is served before a thread that
already had its turn (round robin over threads, first come first served within one). Only a
caller that asks not to wait (``wait=False``) gets :class:`Busy`, at once and without sending.

The hot path (a free slot and nobody waiting) takes no lock: slots are items of a ``deque``
whose ``pop``/``append`` the GIL makes atomic. In gVisor every lock acquisition reads the clock,
a trapped system call (see ``connection.py``). Waiting and handing slots over take the lock;
each side re-checks the other after publishing its own state, so no wake-up is lost.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque

from symphony.errors import Busy, SymphonyError


class _Waiter:
    __slots__ = ("event", "granted", "n")

    def __init__(self, n: int) -> None:
        self.n = n
        self.granted = False
        self.event = threading.Event()


class Admission:
    """``cap`` slots; :meth:`acquire` takes ``n`` (waiting fairly), :meth:`release` gives back."""

    def __init__(self, cap: int) -> None:
        if cap < 1:
            raise ValueError("cap must be at least 1")
        self.cap = cap
        self._slots: deque[None] = deque([None] * cap)
        self._lock = threading.Lock()
        #: Waiting callers by thread, in the order their threads are served next.
        self._queue: OrderedDict[int, deque[_Waiter]] = OrderedDict()
        self._failed: SymphonyError | None = None

    @property
    def in_flight(self) -> int:
        return self.cap - len(self._slots)

    def acquire(self, n: int = 1, *, wait: bool = True, deadline: float | None = None, op: str | None = None) -> None:
        """Take ``n`` slots (``n`` <= ``cap``). Waits for them unless ``wait`` is false
        (:class:`Busy`); ``TimeoutError`` at ``deadline`` (``time.monotonic()``)."""
        if n > self.cap:
            raise ValueError(f"{n} calls at once exceed the in-flight cap of {self.cap}")
        if self._failed is not None:
            raise self._failed
        if not self._queue and self._take(n):
            return
        if not wait:
            raise Busy(
                f"{self.cap} calls already in flight on this connection (the worker's cap); "
                "call with wait=True to queue instead",
                op=op,
            )
        waiter = _Waiter(n)
        me = threading.get_ident()
        with self._lock:
            self._queue.setdefault(me, deque()).append(waiter)
            self._grant_locked()
        while not waiter.granted:
            left = None if deadline is None else deadline - time.monotonic()
            if (left is not None and left <= 0) or not waiter.event.wait(left):
                with self._lock:
                    if waiter.granted:
                        return
                    self._forget_locked(me, waiter)
                    self._grant_locked()  # it may have blocked a smaller request behind it
                raise TimeoutError(f"no room for {op or 'the call'} among {self.cap} calls in flight")
            if self._failed is not None and not waiter.granted:
                raise self._failed
        if self._failed is not None:
            raise self._failed

    def release(self, n: int = 1) -> None:
        for _ in range(n):
            self._slots.append(None)
        if self._queue:  # after appending: a waiter that queued before sees the slots here
            with self._lock:
                self._grant_locked()

    def fail(self, error: SymphonyError) -> None:
        """The connection is gone: every waiter (and later caller) raises ``error``."""
        self._failed = error
        with self._lock:
            waiters = [w for q in self._queue.values() for w in q]
            self._queue.clear()
        for w in waiters:
            w.event.set()

    # ------------------------------------------------------------------------ inside
    def _take(self, n: int) -> bool:
        taken = 0
        try:
            while taken < n:
                self._slots.pop()
                taken += 1
        except IndexError:
            for _ in range(taken):
                self._slots.append(None)
            return False
        return True

    def _grant_locked(self) -> None:
        """Hand free slots to waiters, one thread at a time in turn (the lock is held)."""
        while self._queue:
            thread, waiters = next(iter(self._queue.items()))
            head = waiters[0]
            if not self._take(head.n):
                return  # the head waits for more slots; nobody jumps it (no starvation)
            waiters.popleft()
            if waiters:
                self._queue.move_to_end(thread)  # its next call waits behind the other threads
            else:
                del self._queue[thread]
            head.granted = True
            head.event.set()

    def _forget_locked(self, thread: int, waiter: _Waiter) -> None:
        waiters = self._queue.get(thread)
        if waiters is None:
            return
        try:
            waiters.remove(waiter)
        except ValueError:
            return
        if not waiters:
            del self._queue[thread]
