"""A few ``grammar_child`` processes that compile grammars for the worker, each killable.

Everything here runs on the worker's event loop: a compile is a frame written to an idle
child and awaited with the time budget. A child past the budget is killed (what it held goes
with it) and a fresh one started.

The children are a pool shared by every tenant (``resource_model.PoolName.GRAMMAR_PROCESSES``),
handed out per *account* (``account_slots``): one account compiles in at most the pool's ceiling
of them at once (with two: one), so the others always find one free. An account whose compile
was killed keeps its slot (not its caller, who has the refusal at once) until the replacement
child is ready: the restart is its cost, and the reserve left for the others stays a ready child.
The kill also opens a back-off for the account (``grammar_backoff``): its compiles are refused
with EBUSY until it ends, checked before it waits for a slot and again once it has one (a compile
queued behind the killed one does not start either).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import socket
from typing import Any

import msgpack

from gpu_worker import grammar_child
from gpu_worker.account_slots import AccountSlots
from gpu_worker.grammar_backoff import CompileBackoff
from gpu_worker.resource_model import Pool, PoolName

log = logging.getLogger(__name__)

#: A child that has not said it is ready by then is killed and started again.
START_TIMEOUT_S = 120.0


class CompileTimeout(Exception):
    """The compile ran past its budget; its child was killed."""


#: Children are forked from one server process per worker that imported ``grammar_child`` (and
#: so xgrammar, ~7 s of one core) once: a child, and the replacement of a killed one, is ready in
#: milliseconds instead of paying that import each time.
_FORKS = multiprocessing.get_context("forkserver")
_FORKS.set_forkserver_preload(["gpu_worker.grammar_child"])


class _Child:
    """One forked child and the worker's end of its socket."""

    def __init__(self, proc: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.proc = proc
        self.reader = reader
        self.writer = writer

    @classmethod
    async def fork(cls) -> _Child:
        ours, theirs = socket.socketpair()
        proc = _FORKS.Process(target=grammar_child.serve, args=(theirs,), name="grammar-child", daemon=True)
        try:
            # The first start launches the fork server and waits for its imports: not on the loop.
            await asyncio.get_running_loop().run_in_executor(None, proc.start)
        finally:
            theirs.close()
        reader, writer = await asyncio.open_unix_connection(sock=ours)
        return cls(proc, reader, writer)

    async def request(self, obj: Any) -> Any:
        self.writer.write(grammar_child.encode_frame(obj))
        await self.writer.drain()
        header = await self.reader.readexactly(4)
        body = await self.reader.readexactly(int.from_bytes(header, "big"))
        return msgpack.unpackb(body, raw=False)

    def kill(self) -> None:
        with contextlib.suppress(Exception):
            self.proc.kill()
        self.writer.close()

    async def wait(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.proc.join, 10.0)


class CompilePool:
    """``processes`` children; ``compile(kind, source, timeout_s, account)`` -> serialized grammar."""

    def __init__(
        self, tokenizer_info_json: str, processes: int, max_bytes: int, backoff: CompileBackoff | None = None
    ) -> None:
        self._init = {"tokenizer_info": tokenizer_info_json, "max_bytes": max_bytes}
        self._processes = processes
        self.slots = AccountSlots(Pool(PoolName.GRAMMAR_PROCESSES, processes))
        self.backoff = backoff or CompileBackoff(0.0, 0.0)
        self._idle: asyncio.Queue[_Child] = asyncio.Queue()
        self._starting: set[asyncio.Task] = set()
        self._children: set[_Child] = set()
        self._closed = False
        self.killed = 0

    @property
    def idle(self) -> int:
        """Children started and waiting for a compile (the pool's size once every replacement of
        a killed child is ready)."""
        return self._idle.qsize()

    async def start(self) -> None:
        """Start every child; returns once they are ready (or were given up and retried)."""
        for _ in range(self._processes):
            self._replace()
        await asyncio.gather(*self._starting, return_exceptions=True)

    def _replace(self) -> asyncio.Task | None:
        """Start a child in the background (``None`` once closed)."""
        if self._closed:
            return None
        task = asyncio.get_running_loop().create_task(self._spawn())
        self._starting.add(task)
        task.add_done_callback(self._starting.discard)
        return task

    async def _spawn(self) -> None:
        try:
            child = await _Child.fork()
        except OSError as exc:
            log.error("event=grammar_child_fork_failed error=%r", exc)
            await asyncio.sleep(1.0)
            self._replace()
            return
        self._children.add(child)
        try:
            await asyncio.wait_for(child.request(self._init), START_TIMEOUT_S)
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError, OSError) as exc:
            log.error("event=grammar_child_failed pid=%s error=%r", child.proc.pid, exc)
            await self._reap(child)
            await asyncio.sleep(1.0)
            self._replace()
            return
        if self._closed:
            await self._reap(child)
            return
        self._idle.put_nowait(child)

    async def _reap(self, child: _Child) -> None:
        self._children.discard(child)
        child.kill()
        with contextlib.suppress(Exception):
            await child.wait()

    async def compile(self, kind: str, source: str, timeout_s: float, account: str) -> dict[str, Any]:
        """``{"ok": serialized}`` or ``{"err": message}`` of a compile counted against
        ``account``; raises :class:`CompileTimeout`, or EBUSY while the account's back-off
        after a killed compile is open."""
        self.backoff.check(account)
        await self.slots.acquire(account)
        slot_handed_on = False
        try:
            self.backoff.check(account)  # a kill while this one waited for the slot
            child = await self._idle.get()
            try:
                reply = await asyncio.wait_for(child.request({"kind": kind, "source": source}), timeout_s)
            except TimeoutError:
                self.killed += 1
                backoff_s = self.backoff.killed(account)
                log.warning(
                    "event=grammar_compile_killed pid=%d kind=%s timeout_s=%s account=%s backoff_s=%s",
                    child.proc.pid,
                    kind,
                    timeout_s,
                    account,
                    backoff_s,
                )
                await self._reap(child)
                replacement = self._replace()
                if replacement is not None:
                    # The refusal answers now; the account's slot is given back once the
                    # replacement is ready (or was given up and retried), so the restart is the
                    # account's cost and the others keep a ready child.
                    replacement.add_done_callback(lambda _task: self.slots.release(account))
                    slot_handed_on = True
                raise CompileTimeout from None
            except BaseException:
                # A child that died or a compile cancelled mid-frame: the stream is out of step.
                await self._reap(child)
                self._replace()
                raise
            self._idle.put_nowait(child)
            return reply
        finally:
            if not slot_handed_on:
                self.slots.release(account)

    async def close(self) -> None:
        self._closed = True
        for task in list(self._starting):
            task.cancel()
        for child in list(self._children):
            await self._reap(child)
