"""Session connections within the worker's :class:`ConnectionLimits`.

A LIP is hostile code that can open its session socket as often as it likes, send frames as
slowly as it likes and never read what the worker answers. This module keeps what that costs the
worker bounded and on the LIP's own account:

* **back-pressure**: a connection whose unsent replies pass ``max_unsent_reply_bytes`` is not read
  any further until they drain, so a client that does not read stops being served instead of
  growing the worker's memory (its own calls wait; other connections keep flowing);
* **connections**: past ``max_connections_per_session`` (or ``max_connections`` over the whole
  worker) a new connection gets one ``EBUSY`` frame and is closed;
* **timeouts**: a connection without a valid ``hello`` after ``hello_timeout_s``, or with a frame
  started (its first byte read) but not complete after ``frame_timeout_s``, is closed. One watchdog
  task checks every connection a few times per timeout, so the per-frame path sets no timer;
* **partial frames**: a frame larger than the stream reader's buffer reserves its announced
  length against the session's and the worker's budget while its body arrives; past either,
  it is refused (``EBUSY``) and the connection closed.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
import weakref
from dataclasses import dataclass

from gpu_worker import protocol
from gpu_worker.config import ConnectionLimits
from gpu_worker.protocol import ErrorCode, ProtocolError
from gpu_worker.sessions import WorkerSession

log = logging.getLogger(__name__)

#: Bytes a connection's stream reader holds ahead of the frame being read (asyncio stops reading
#: the socket at twice this); a frame body larger than it counts against the partial-frame budget.
READ_BUFFER_BYTES = 64 * 1024


@dataclass(eq=False)
class Conn:
    """One open session connection, as the watchdog and the budgets see it."""

    session: WorkerSession
    writer: asyncio.StreamWriter
    opened: float
    authenticated: bool = False
    #: When the header of the frame being received arrived (``None``: between frames).
    frame_since: float | None = None
    closed: bool = False


class ConnectionGuard:
    """The worker's session connections: admission, budgets, back-pressure and the watchdog."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.conns: set[Conn] = set()
        #: Announced bytes of large frames being received, over every connection.
        self.partial_bytes = 0
        self.refused = 0
        self.timed_out = 0
        self._warned: weakref.WeakSet[WorkerSession] = weakref.WeakSet()

    def stats(self) -> dict[str, int]:
        """Open session connections, partial-frame bytes and what was refused or timed out."""
        return {
            "open": len(self.conns),
            "partial_frame_bytes": self.partial_bytes,
            "refused": self.refused,
            "timed_out": self.timed_out,
        }

    # ------------------------------------------------------------------- lifecycle
    def admit(self, session: WorkerSession, writer: asyncio.StreamWriter) -> Conn | None:
        """Register a new connection of ``session``, or refuse it (``None``: already closed)."""
        total = self.limits.max_connections
        limit = self.limits.max_connections_per_session
        if len(self.conns) >= total:
            error = ProtocolError(ErrorCode.BUSY, f"worker has {total} open session connections (max_connections)")
        elif len(session.conns) >= limit:
            error = ProtocolError(ErrorCode.BUSY, f"session has {limit} open connections (max_connections_per_session)")
        else:
            conn = Conn(session, writer, time.monotonic())
            session.conns.add(conn)
            self.conns.add(conn)
            apply_back_pressure_limits(writer, self.limits.max_unsent_reply_bytes)
            return conn
        self.refused += 1
        if session not in self._warned:  # once per session: a connect loop must not flood the log
            self._warned.add(session)
            log.warning(
                "event=connection_refused session=%s tenant=%s reason=%s",
                session.session_id,
                session.tenant,
                error.message,
            )
        close_with(writer, error)
        return None

    def forget(self, conn: Conn) -> None:
        conn.closed = True
        conn.session.conns.discard(conn)
        self.conns.discard(conn)

    # ---------------------------------------------------------------------- frames
    async def read_frame(self, conn: Conn, reader: asyncio.StreamReader) -> bytes:
        """The next frame's body; raises ``ProtocolError`` for a frame the limits refuse (the
        caller answers and closes), ``IncompleteReadError``/``ConnectionError`` at the end."""
        first = await reader.readexactly(1)
        # The frame has started at its first byte: a header that stops half-way is timed out too.
        conn.frame_since = time.monotonic()
        try:
            header = first + await reader.readexactly(protocol.HEADER_BYTES - 1)
            length = protocol.frame_length(header)
            if not conn.authenticated and length > protocol.MAX_HELLO_FRAME_BYTES:
                raise ProtocolError(
                    ErrorCode.BAD_FRAME,
                    f"frame of {length} bytes before hello (MAX_HELLO_FRAME_BYTES is {protocol.MAX_HELLO_FRAME_BYTES})",
                )
            if length <= READ_BUFFER_BYTES:
                return await reader.readexactly(length)
            self._reserve(conn.session, length)
            try:
                return await reader.readexactly(length)
            finally:
                self.partial_bytes -= length
                conn.session.partial_frame_bytes -= length
        finally:
            conn.frame_since = None

    def _reserve(self, s: WorkerSession, length: int) -> None:
        per_session = self.limits.max_partial_frame_bytes_per_session
        if s.partial_frame_bytes + length > per_session:
            raise ProtocolError(
                ErrorCode.BUSY,
                f"frame of {length} bytes refused: {s.partial_frame_bytes} bytes of this session's frames are"
                f" still arriving (max_partial_frame_bytes_per_session {per_session})",
            )
        total = self.limits.max_partial_frame_bytes
        if self.partial_bytes + length > total:
            raise ProtocolError(
                ErrorCode.BUSY,
                f"frame of {length} bytes refused: the worker is receiving {self.partial_bytes} bytes of large"
                f" frames (max_partial_frame_bytes {total}); retry later",
            )
        s.partial_frame_bytes += length
        self.partial_bytes += length

    # -------------------------------------------------------------------- watchdog
    def check_interval(self) -> float:
        """How often :meth:`watch` looks: a few times per timeout, within [0.05, 1] s."""
        return min(1.0, max(0.05, min(self.limits.hello_timeout_s, self.limits.frame_timeout_s) / 4))

    async def watch(self) -> None:
        """Close connections past the hello or frame-completion timeout, until cancelled."""
        while True:
            await asyncio.sleep(self.check_interval())
            self.close_overdue(time.monotonic())

    def close_overdue(self, now: float) -> None:
        for conn in list(self.conns):
            if conn.closed:
                continue
            if not conn.authenticated and now - conn.opened > self.limits.hello_timeout_s:
                error = ProtocolError(
                    ErrorCode.NOT_AUTHENTICATED, f"no hello within {self.limits.hello_timeout_s}s (hello_timeout_s)"
                )
            elif conn.frame_since is not None and now - conn.frame_since > self.limits.frame_timeout_s:
                error = ProtocolError(
                    ErrorCode.TIMEOUT, f"frame not complete within {self.limits.frame_timeout_s}s (frame_timeout_s)"
                )
            else:
                continue
            self.timed_out += 1
            log.warning(
                "event=connection_timed_out session=%s tenant=%s reason=%s",
                conn.session.session_id,
                conn.session.tenant,
                error.code,
            )
            self.forget(conn)
            close_with(conn.writer, error)


def apply_back_pressure_limits(writer: asyncio.StreamWriter, max_unsent: int) -> None:
    """``drain`` waits once ``max_unsent`` bytes are unsent, until they are below a quarter: the
    session loop (``Worker._serve``) drains before reading the next request when over the bound."""
    writer.transport.set_write_buffer_limits(high=max_unsent, low=max_unsent // 4)


def close_with(writer: asyncio.StreamWriter, error: ProtocolError) -> None:
    """Send one error frame not tied to a request and close; a peer that reads nothing (the
    frame does not even fit its socket buffer) is cut off at once so its descriptor is freed."""
    transport = writer.transport
    if transport.is_closing():
        return
    writer.write(protocol.pack(protocol.err_reply(None, error)))
    if transport.get_write_buffer_size() > 0:
        transport.abort()
    else:
        writer.close()


def raise_open_file_limit(limits: ConnectionLimits, log_to: logging.Logger = log) -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (services often start at 1024) and say so
    if even that is short of ``max_connections`` plus room for everything else; returns it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, limits.max_connections + 1024)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log_to.warning("event=nofile_unchanged soft=%d hard=%d error=%s", soft, hard, exc)
    if soft < limits.max_connections + 256:
        log_to.warning("event=nofile_low soft=%d max_connections=%d", soft, limits.max_connections)
    return soft
