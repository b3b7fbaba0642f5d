"""``pred`` calls of one session connection, relayed between socket and scheduler without a Task.

Every generated token is one ``pred``, so its path through the event loop is the per-token cost
of program-driven decoding, paid in the gap between two forwards (B3: ~0.2 ms of the loop's time
per call, times the calls of a forward). The other ops run as one Task each
(``Worker._dispatch``); a ``pred`` is admitted synchronously when its frame is read, submitted to
the scheduler, and answered from a done-callback of the scheduler's future. That skips the Task,
the coroutine frames, the asyncio future that mirrors the scheduler's, and the per-call timeout
context: one loop callback per finished call.

Semantics are those of a Task per call: the run's deadline answers a call still in flight with
TIMEOUT, a closed connection abandons its calls (no reply), and each call's reservations are
released exactly once, when its future is done or cancelled.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpu_worker import lip_ops, protocol
from gpu_worker.kvfs import KVFSError
from gpu_worker.protocol import ErrorCode, ProtocolError
from gpu_worker.scheduler import PredCall
from gpu_worker.sessions import Session

if TYPE_CHECKING:
    from gpu_worker.server import Worker

log = logging.getLogger(__name__)

Send = Callable[[asyncio.StreamWriter, dict[str, Any]], None]


@dataclass(eq=False)
class _InFlight:
    req_id: int
    call: PredCall
    timer: asyncio.TimerHandle | None = None
    timed_out: bool = False


class PredRelay:
    """The ``pred`` calls in flight on one session connection."""

    def __init__(self, worker: Worker, session: Session, writer: asyncio.StreamWriter, send: Send) -> None:
        self._worker = worker
        self._session = session
        self._writer = writer
        self._send = send
        self._loop = asyncio.get_running_loop()
        self._pending: set[_InFlight] = set()

    def __len__(self) -> int:
        return len(self._pending)

    def start(self, req_id: int, args: dict[str, Any]) -> None:
        """Admit and submit one ``pred``; a refused call is answered at once."""
        s = self._session
        try:
            if s.ended:
                raise ProtocolError(ErrorCode.TIMEOUT, "session ended")
            call = lip_ops.admit_pred(self._worker, s, args)
        except Exception as exc:
            self._send(self._writer, protocol.err_reply(req_id, error_reply(exc, "pred", s.session_id)))
            return
        try:
            future = self._worker.scheduler.submit(call)
        except Exception as exc:  # shutting down
            lip_ops.release_pred(s, call)
            self._send(self._writer, protocol.err_reply(req_id, error_reply(exc, "pred", s.session_id)))
            return
        entry = _InFlight(req_id, call)
        self._pending.add(entry)
        left = s.time_left()
        if left is not None:
            entry.timer = self._loop.call_later(left, self._deadline_passed, entry)
        future.add_done_callback(lambda _: self._from_any_thread(entry))

    def abandon_all(self) -> None:
        """The connection closed: its calls get no reply (each is released when cancelled)."""
        for entry in list(self._pending):
            entry.call.future.cancel()

    def _from_any_thread(self, entry: _InFlight) -> None:
        # Done-callbacks run on the engine thread (settled) or on the loop (cancelled).
        try:
            self._loop.call_soon_threadsafe(self._finish, entry)
        except RuntimeError:  # the loop closed under a worker shutting down
            pass

    def _deadline_passed(self, entry: _InFlight) -> None:
        entry.timer = None
        if entry.call.future.cancel():  # still queued or running: the run is out of time
            entry.timed_out = True

    def _finish(self, entry: _InFlight) -> None:
        self._pending.discard(entry)
        if entry.timer is not None:
            entry.timer.cancel()
        s, call, future = self._session, entry.call, entry.call.future
        lip_ops.release_pred(s, call)
        if entry.timed_out:
            reply = protocol.err_reply(entry.req_id, s.deadline_error())
        elif future.cancelled():
            return
        else:
            reply = self._reply(entry.req_id, call, future)
        self._send(self._writer, reply)

    def _reply(self, req_id: int, call: PredCall, future: concurrent.futures.Future) -> dict[str, Any]:
        s = self._session
        try:
            value = lip_ops.pred_value(s, call, future.result())  # raises the call's error
        except Exception as exc:
            return protocol.err_reply(req_id, error_reply(exc, "pred", s.session_id))
        return protocol.ok_reply(req_id, value)


def error_reply(exc: BaseException, op: str, session_id: str) -> ProtocolError:
    """The protocol error a failed op answers with; an unexpected one is logged with its trace
    and answered as INTERNAL without details."""
    if isinstance(exc, ProtocolError):
        return exc
    if isinstance(exc, KVFSError):
        return ProtocolError(exc.code, exc.message)
    log.error("event=op_failed op=%s session=%s", op[:64], session_id, exc_info=exc)
    return ProtocolError(ErrorCode.INTERNAL, f"{op} failed: {type(exc).__name__}")
