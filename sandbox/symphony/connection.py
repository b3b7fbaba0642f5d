"""One authenticated session connection with many calls in flight.

Callers on any thread send a request and wait for its reply; writes are serialised by a lock so
frames never interleave, and replies are routed to their callers by request id. This is what
makes real threads in a LIP (parallel decoding with ``kv_fork``) turn into concurrent ``pred``
calls that the worker can batch together.

Who reads the socket: the *reading role* (leader/follower). A thread waiting in :meth:`call`
takes the role if nobody holds it and reads until its own reply is in, handing other threads'
replies to them on the way; then it wakes a thread still waiting to take the role over. A
one-threaded LIP therefore reads its own replies: no reader thread, no hand-off between threads.
A background reader thread takes the role for good once a caller uses :meth:`submit` (futures
that complete on their own: the asyncio flavour, tests), since nobody may wait in :meth:`call`.

Why it is built this way (measured for B2, in gVisor): every system call traps there (~20 µs),
``clock_gettime`` included (its vDSO falls back to the system call on these VMs), and CPython
3.11 reads the clock on *every* lock acquisition, even a non-blocking one. A call through a
reader thread and a ``Future`` cost ~19 system calls, 11 of them clock reads. So the hot path
takes two locks per call (sending, and trying for the reading role) and keeps its state in
plain attributes and dicts, which the GIL makes atomic; every check-then-wait below is ordered
so that a wake-up cannot be lost (set the flag, then read the other side's).

Back-pressure (``admission.py``): a call takes one of the connection's in-flight slots before it
is sent and gives it back when its reply is routed, so a LIP with more threads than the worker's
cap queues instead of getting ``EBUSY``. One slot below the worker's cap is kept for the
fire-and-forget ``dist_release`` of garbage-collected Dists (at most one in flight), whose reply
nobody waits for.
"""

from __future__ import annotations

import itertools
import os
import select
import socket
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from symphony.admission import Admission
from symphony.errors import ConnectionLost, NotAuthenticated, SymphonyError, from_wire
from symphony.wire import protocol

if TYPE_CHECKING:  # imported by ``submit`` only: with ``logging`` under it, ~25 ms of a cold start
    from concurrent.futures import Future

#: Default locations inside the sandbox (the launcher mounts the socket there).
DEFAULT_SOCKET = "/run/symphony/session.sock"
ENV_SOCKET = "SYMPHONY_SOCKET"
ENV_TOKEN = "SYMPHONY_TOKEN"  # noqa: S105 - the name of the variable, not a secret
#: Bytes asked of the socket per read: replies that arrived together are parsed from one read.
READ_CHUNK = 1 << 16


@dataclass(frozen=True)
class SessionInfo:
    """What ``hello`` returned: who we are and the served model's basic facts."""

    session_id: str
    tenant: str
    run_id: str
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    block_size: int
    protocol_version: int
    #: Calls the worker lets this connection have in flight (its ``EBUSY`` caps).
    max_in_flight: int = protocol.MAX_IN_FLIGHT


class _EndOfStream(Exception):
    """The worker closed the connection."""


class _Call:
    """One request in flight: its reply once ``done``, and how to tell whoever waits for it."""

    __slots__ = ("done", "error", "future", "more_error", "on_done", "on_more", "op", "value", "wake")

    def __init__(self, op: str, future: Future | None, on_done: Any = None, on_more: Any = None) -> None:
        self.op = op
        #: Called once with the reply (gives back the call's in-flight slot).
        self.on_done = on_done
        #: Called with each progress frame's value (``pred`` with ``stream``), on the reading thread.
        self.on_more = on_more
        #: What ``on_more`` raised: the call's result raises it (the reader must go on reading).
        self.more_error: Exception | None = None
        self.value: Any = None
        self.error: SymphonyError | None = None
        self.done = False
        self.future = future  # for ``submit`` callers
        self.wake: threading.Event | None = None  # set by a caller waiting while another reads

    def complete(self, value: Any, error: SymphonyError | None) -> None:
        self.value, self.error = value, error
        self.done = True  # before reading ``wake``: the waiter sets ``wake`` before re-checking
        if self.on_done is not None:
            on_done, self.on_done = self.on_done, None
            on_done()
        if self.future is not None and not self.future.done():
            if error is not None or self.more_error is not None:
                self.future.set_exception(error or self.more_error)
            else:
                self.future.set_result(value)
        if self.wake is not None:
            self.wake.set()

    def result(self) -> Any:
        if self.error is not None:
            raise self.error
        if self.more_error is not None:
            raise self.more_error
        return self.value

    def progress(self, value: Any) -> None:
        if self.on_more is None or self.more_error is not None:
            return
        try:
            self.on_more(value)
        except Exception as exc:  # the caller's callback: its call raises it, the reader goes on
            self.more_error = exc


class Connection:
    """A session connection; create with :meth:`open` (or :func:`symphony.connect`)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._ids = itertools.count(1)
        self._pending: dict[int, _Call] = {}
        self._send_lock = threading.Lock()
        #: The reading role (see the module docstring): held by one thread at a time.
        self._role = threading.Lock()
        #: Calls whose callers wait while another thread reads: one is woken to take the role.
        self._waiting: dict[int, _Call] = {}
        self._closed: SymphonyError | None = None
        self._rbuf = bytearray()  # bytes read but not yet parsed (only the role holder touches it)
        #: An error frame not tied to a request (e.g. a bad frame): the cause if the worker closes.
        self._unsolicited: SymphonyError | None = None
        self._reader: threading.Thread | None = None
        self._reader_lock = threading.Lock()
        #: Dist handles whose Python objects died; released in one batch with a later call.
        self.deferred_releases: deque[int] = deque()
        self._release_in_flight = False
        self.info: SessionInfo | None = None
        #: In-flight slots (set from ``hello``); see the module docstring.
        self.admission = Admission(protocol.MAX_IN_FLIGHT - 1)
        #: Whether a call finding every slot taken waits (default) or raises ``Busy`` at once.
        self.wait_for_room = True

    # ------------------------------------------------------------------ lifecycle
    @classmethod
    def open(cls, path: str | None = None, token: str | None = None, timeout: float = 30.0) -> Connection:
        """Connect to the session socket and authenticate with ``hello``."""
        path = path or os.environ.get(ENV_SOCKET) or DEFAULT_SOCKET
        token = token if token is not None else os.environ.get(ENV_TOKEN)
        if not token:
            raise NotAuthenticated(f"no session token (set {ENV_TOKEN})", op=protocol.Hello.OP)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(path)
        except OSError as exc:
            sock.close()
            raise ConnectionLost(f"cannot connect to session socket {path}: {exc}", op=protocol.Hello.OP) from None
        conn = cls(sock)
        try:
            conn._hello(token)
        except BaseException:
            sock.close()
            raise
        sock.settimeout(None)
        return conn

    def _hello(self, token: str) -> None:
        """Synchronous handshake before any other call (nothing else is in flight)."""
        hello = protocol.Hello(token=token)
        self._sock.sendall(protocol.pack(protocol.request(0, hello.OP, hello.to_wire())))
        try:
            _, value, error = protocol.parse_reply(protocol.unpack_body(self._read_frame()))
        except (_EndOfStream, OSError):
            raise ConnectionLost("worker closed the connection during hello", op=hello.OP) from None
        if error is not None:
            raise from_wire(error.code, error.message, hello.OP, error.reason)
        reply = protocol.HelloReply.from_wire(value)
        self.info = SessionInfo(
            session_id=reply.session_id,
            tenant=reply.tenant,
            run_id=reply.run_id or "",
            vocab_size=int(reply.vocab_size),
            eos_token_ids=tuple(reply.eos_token_ids),
            block_size=int(reply.block_size),
            protocol_version=int(reply.protocol_version or 1),
            max_in_flight=int(reply.max_in_flight),
        )
        self.admission = Admission(max(1, self.info.max_in_flight - 1))

    def close(self) -> None:
        """Close the socket; calls still waiting (for a reply or for room) fail with
        :class:`ConnectionLost`."""
        self._fail_all(ConnectionLost("connection closed by the program"))
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()

    @property
    def closed(self) -> bool:
        return self._closed is not None

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------------- calls
    def submit(self, op: str, args: dict[str, Any] | None = None, on_more: Any = None) -> Future:
        """Send one request; the returned future resolves to the reply value or raises on its
        own (a background reader thread takes the reading role from here on). ``on_more``: see
        :meth:`call`."""
        from concurrent.futures import Future

        fut: Future = Future()
        self._send(op, args, fut, on_more=on_more)
        self._start_reader()
        return fut

    def call(
        self,
        op: str,
        args: dict[str, Any] | None = None,
        timeout: float | None = None,
        wait: bool | None = None,
        on_more: Any = None,
    ) -> Any:
        """Send one request and block until its reply (other threads may call meanwhile);
        ``TimeoutError`` after ``timeout`` seconds (waiting for room included). With every
        in-flight slot taken the call waits its turn, or raises ``Busy`` at once when ``wait``
        is false (default: :attr:`wait_for_room`). ``on_more(value)`` gets each progress frame
        of the call before its reply, on whichever thread reads the socket: it must be quick and
        make no call of its own (that thread holds the reading role); what it raises is raised
        by this call once its reply is in."""
        deadline = None if timeout is None else time.monotonic() + timeout
        req_id, call = self._send(op, args, None, wait, deadline, on_more)
        self._await(req_id, call, deadline)
        if not call.done:  # its late reply is still routed (and frees its slot)
            raise TimeoutError(f"no reply to {op} within {timeout} s")
        return call.result()

    def call_many(self, requests: Sequence[tuple[str, dict[str, Any] | None]]) -> list[Any]:
        """Send several requests in **one write** and block until every reply is in; the
        values in request order. If any failed, the first failure is raised once all are in
        (the others took effect).

        Why: in gVisor every system call traps, and each thread woken for its reply costs
        more (futex, clock reads, the GIL). A LIP stepping many sequences in lock-step sends
        the step's calls together and reads their replies with one thread: B2 measured the
        gap between forwards at ~13 ms this way against ~25 ms with one thread per lane."""
        if not requests:
            return []
        if self._closed is not None:
            raise self._closed
        # More requests than the in-flight cap go in several writes, each awaited before the
        # next is admitted (nobody else would read its replies while this thread waits for room).
        sent: list[tuple[int, _Call]] = []
        cap = self.admission.cap
        for start in range(0, len(requests), cap):
            group = self._send_group(requests[start : start + cap])
            for req_id, call in group:
                self._await(req_id, call, None)
            sent.extend(group)
        for _, call in sent:
            if call.error is not None:
                raise call.error
        return [call.value for _, call in sent]

    def _send_group(self, requests: Sequence[tuple[str, dict[str, Any] | None]]) -> list[tuple[int, _Call]]:
        frames: list[bytes] = []
        sent: list[tuple[int, _Call]] = []
        for op, args in requests:
            req_id = next(self._ids)
            try:
                frames.append(protocol.pack(protocol.request(req_id, op, args)))
            except protocol.ProtocolError as exc:
                raise from_wire(exc.code, exc.message, op) from None
            sent.append((req_id, _Call(op, None, self.admission.release)))
        self.admission.acquire(len(sent), wait=self.wait_for_room, op=requests[0][0])
        self._register_and_write(sent, b"".join(frames))
        return sent

    def flush_releases(self) -> None:
        """Release Dist handles whose objects were garbage-collected (one fire-and-forget call:
        its reply is read by whoever reads next)."""
        if self._release_in_flight or not self.deferred_releases or self._closed is not None:
            return  # one at a time, in the slot kept for it; the ids wait for the next call
        ids: list[int] = []
        while self.deferred_releases and len(ids) < 4096:
            ids.append(self.deferred_releases.popleft())
        self._release_in_flight = True
        req_id = next(self._ids)
        release = protocol.DistRelease(dists=ids)
        call = _Call(release.OP, None, self._release_done)
        frame = protocol.pack(protocol.request(req_id, release.OP, release.to_wire()))
        self._register_and_write([(req_id, call)], frame)

    def _release_done(self) -> None:
        self._release_in_flight = False

    def _send(
        self,
        op: str,
        args: dict[str, Any] | None,
        future: Future | None,
        wait: bool | None = None,
        deadline: float | None = None,
        on_more: Any = None,
    ) -> tuple[int, _Call]:
        if self._closed is not None:
            raise self._closed
        req_id = next(self._ids)
        try:
            frame = protocol.pack(protocol.request(req_id, op, args))
        except protocol.ProtocolError as exc:
            raise from_wire(exc.code, exc.message, op) from None
        self.admission.acquire(1, wait=self.wait_for_room if wait is None else wait, deadline=deadline, op=op)
        call = _Call(op, future, self.admission.release, on_more)
        self._register_and_write([(req_id, call)], frame)
        return req_id, call

    def _register_and_write(self, calls: list[tuple[int, _Call]], data: bytes) -> None:
        """Make ``calls`` routable, then write their frames (``data``) in one piece."""
        for req_id, call in calls:
            self._pending[req_id] = call
        if self._closed is not None:  # closed after the first check: _fail_all may have missed it
            for req_id, call in calls:
                if self._pending.pop(req_id, None) is not None:
                    call.complete(None, self._closed)  # gives its slot back
            raise self._closed
        try:
            with self._send_lock:
                self._write(data)
        except OSError as exc:
            self._fail_all(ConnectionLost(f"session socket failed: {exc}"))
        except protocol.ProtocolError as exc:
            self._fail_all(ConnectionLost(f"undecodable reply from the worker: {exc}"))

    def _write(self, data: bytes) -> None:
        """Write ``data`` whole, reading replies while the socket is full.

        The worker stops reading a connection whose replies go unread (back-pressure), so a
        writer that only waited for room could wait forever on replies nobody reads: a large
        ``call_many`` is written before its replies are read. One non-blocking send is the common
        case (one system call, as ``sendall``)."""
        view = memoryview(data)
        while view and self._closed is None:
            try:
                view = view[self._sock.send(view, socket.MSG_DONTWAIT) :]
            except BlockingIOError:
                pass
            if view:
                self._wait_writable()

    def _wait_writable(self) -> None:
        """Until the socket takes more bytes; meanwhile read and route replies if no other thread
        holds the reading role (one that does reads them anyway)."""
        if not self._role.acquire(blocking=False):
            select.select([], [self._sock], [], 0.05)
            return
        try:
            readable, _, _ = select.select([self._sock], [self._sock], [])
            if not readable:
                return
            try:
                chunk = self._sock.recv(READ_CHUNK, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            if not chunk:
                raise ConnectionResetError("the worker closed the session connection")
            self._rbuf.extend(chunk)
            while (body := self._buffered_frame()) is not None:
                self._route(body)
        finally:
            self._role.release()
            self._wake_a_waiter()

    # ------------------------------------------------------------ the reading role
    def _await(self, req_id: int, call: _Call, deadline: float | None) -> None:
        """Return once ``call`` is done (or at ``deadline``): read the socket while nobody else
        does, otherwise wait to be woken, by the reader at our reply or by a reader leaving."""
        while not call.done:
            if self._role.acquire(blocking=False):
                try:
                    self._read_until(call, deadline)
                finally:
                    self._role.release()
                    self._wake_a_waiter()
                return
            if call.wake is None:
                call.wake = threading.Event()
            self._waiting[req_id] = call  # registered before the re-checks: no lost wake-up
            try:
                if call.done:
                    return
                if self._role.acquire(blocking=False):  # the reader left meanwhile
                    self._role.release()
                    continue
                left = None if deadline is None else deadline - time.monotonic()
                if (left is not None and left <= 0) or not call.wake.wait(left):
                    return  # timed out (``call`` says so)
                call.wake.clear()
            finally:
                self._waiting.pop(req_id, None)

    def _wake_a_waiter(self) -> None:
        """After leaving the role: wake one caller still waiting, to read for itself."""
        for call in list(self._waiting.values()):
            if not call.done and call.wake is not None:
                call.wake.set()
                return

    def _read_until(self, call: _Call | None, deadline: float | None) -> None:
        """Read and route replies until ``call`` is done (``None``: until the connection ends)."""
        try:
            while call is None or not call.done:
                body = self._buffered_frame()
                if body is None and deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0 or not select.select([self._sock], [], [], left)[0]:
                        return  # the caller's timeout; a partial frame stays in the buffer
                self._route(body if body is not None else self._read_frame())
        except _EndOfStream:
            self._fail_all(self._unsolicited or ConnectionLost("the worker closed the session connection"))
        except protocol.ProtocolError as exc:
            self._fail_all(ConnectionLost(f"undecodable reply from the worker: {exc}"))
        except OSError as exc:
            self._fail_all(ConnectionLost(f"session socket failed: {exc}"))

    def _read_frame(self) -> bytes:
        """One frame's body, from bytes already read or reads of up to ``READ_CHUNK``: replies
        that arrived together cost one read. A frame is removed from the buffer only once whole."""
        while (body := self._buffered_frame()) is None:
            chunk = self._sock.recv(READ_CHUNK)
            if not chunk:
                raise _EndOfStream
            self._rbuf.extend(chunk)
        return body

    def _buffered_frame(self) -> bytes | None:
        head = protocol.HEADER_BYTES
        if len(self._rbuf) < head:
            return None
        end = head + protocol.frame_length(bytes(self._rbuf[:head]))
        if len(self._rbuf) < end:
            return None
        body = bytes(self._rbuf[head:end])
        del self._rbuf[:end]
        return body

    def _route(self, body: bytes) -> None:
        msg = protocol.unpack_body(body)
        more = protocol.parse_more(msg)
        if more is not None:  # progress of a call still in flight: it stays pending
            progressing = self._pending.get(more[0])
            if progressing is not None:
                progressing.progress(more[1])
            return
        req_id, value, err = protocol.parse_reply(msg)
        call = self._pending.pop(req_id, None) if isinstance(req_id, int) else None
        if call is None:
            if err is not None and req_id is None:
                # An error the worker could not tie to a request (a frame it could not read, a
                # limit of the connection): no reply to any call in flight can be trusted to come,
                # so each fails with it now instead of hanging until the run's deadline.
                self._unsolicited = from_wire(err.code, err.message, reason=err.reason)
                self._fail_all(self._unsolicited)
            return
        call.complete(value, from_wire(err.code, err.message, call.op, err.reason) if err is not None else None)

    def _start_reader(self) -> None:
        with self._reader_lock:
            if self._reader is not None or self._closed is not None:
                return
            self._reader = threading.Thread(target=self._read_loop, name="symphony-reader", daemon=True)
        self._reader.start()

    def _read_loop(self) -> None:
        """The background reader: waits for the role (a caller holding it leaves once its own
        reply is in) and keeps it for good."""
        self._role.acquire()
        try:
            self._read_until(None, None)
        finally:
            self._role.release()
            self._wake_a_waiter()

    def _fail_all(self, error: SymphonyError) -> None:
        if self._closed is None:
            self._closed = error  # before the snapshot: ``_send`` re-checks after registering
        error = self._closed
        self.admission.fail(error)
        for req_id in list(self._pending):
            call = self._pending.pop(req_id, None)
            if call is not None and not call.done:
                call.complete(None, error)
        for call in list(self._waiting.values()):
            if call.wake is not None:
                call.wake.set()
