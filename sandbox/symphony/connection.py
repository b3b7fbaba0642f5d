"""One authenticated session connection with many calls in flight.

Callers on any thread send a request and wait on a :class:`concurrent.futures.Future`; a
single reader thread routes replies to futures by request id. Writes are serialised by a lock
so frames never interleave. This is what makes real threads in a LIP (parallel decoding with
``kv_fork``) turn into concurrent ``pred`` calls that the worker can batch together.
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from symphony.errors import ConnectionLost, NotAuthenticated, SymphonyError, from_wire
from symphony.wire import protocol

#: Default locations inside the sandbox (the launcher mounts the socket there).
DEFAULT_SOCKET = "/run/symphony/session.sock"
ENV_SOCKET = "SYMPHONY_SOCKET"
ENV_TOKEN = "SYMPHONY_TOKEN"  # noqa: S105 - the name of the variable, not a secret


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


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf.extend(chunk)
    return bytes(buf)


class Connection:
    """A session connection; create with :meth:`open` (or :func:`symphony.connect`)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[str, Future]] = {}
        self._lock = threading.Lock()  # guards _pending and _closed
        self._send_lock = threading.Lock()
        self._closed: SymphonyError | None = None
        self._reader: threading.Thread | None = None
        #: Dist handles whose Python objects died; released in one batch with a later call.
        self.deferred_releases: deque[int] = deque()
        self.info: SessionInfo | None = None

    # ------------------------------------------------------------------ lifecycle
    @classmethod
    def open(cls, path: str | None = None, token: str | None = None, timeout: float = 30.0) -> Connection:
        """Connect to the session socket and authenticate with ``hello``."""
        path = path or os.environ.get(ENV_SOCKET) or DEFAULT_SOCKET
        token = token if token is not None else os.environ.get(ENV_TOKEN)
        if not token:
            raise NotAuthenticated(f"no session token (set {ENV_TOKEN})", op="hello")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(path)
        except OSError as exc:
            sock.close()
            raise ConnectionLost(f"cannot connect to session socket {path}: {exc}", op="hello") from None
        conn = cls(sock)
        try:
            conn._hello(token)
        except BaseException:
            sock.close()
            raise
        sock.settimeout(None)
        conn._reader = threading.Thread(target=conn._read_loop, name="symphony-reader", daemon=True)
        conn._reader.start()
        return conn

    def _hello(self, token: str) -> None:
        """Synchronous handshake before the reader thread exists (nothing else is in flight)."""
        self._sock.sendall(protocol.pack(protocol.request(0, "hello", {"token": token})))
        header = _recv_exact(self._sock, protocol.HEADER_BYTES)
        if header is None:
            raise ConnectionLost("worker closed the connection during hello", op="hello")
        body = _recv_exact(self._sock, protocol.frame_length(header))
        if body is None:
            raise ConnectionLost("worker closed the connection during hello", op="hello")
        _, value, error = protocol.parse_reply(protocol.unpack_body(body))
        if error is not None:
            raise from_wire(error.code, error.message, "hello")
        self.info = SessionInfo(
            session_id=value["session_id"],
            tenant=value["tenant"],
            run_id=value.get("run_id", ""),
            vocab_size=int(value["vocab_size"]),
            eos_token_ids=tuple(value["eos_token_ids"]),
            block_size=int(value["block_size"]),
            protocol_version=int(value.get("protocol_version", 1)),
        )

    def close(self) -> None:
        """Close the socket; calls still waiting fail with :class:`ConnectionLost`."""
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
    def submit(self, op: str, args: dict[str, Any] | None = None) -> Future:
        """Send one request; the returned future resolves to the reply value or raises."""
        fut: Future = Future()
        with self._lock:
            if self._closed is not None:
                raise self._closed
            req_id = next(self._ids)
            self._pending[req_id] = (op, fut)
        try:
            frame = protocol.pack(protocol.request(req_id, op, args))
        except protocol.ProtocolError as exc:
            with self._lock:
                self._pending.pop(req_id, None)
            raise from_wire(exc.code, exc.message, op) from None
        try:
            with self._send_lock:
                self._sock.sendall(frame)
        except OSError as exc:
            self._fail_all(ConnectionLost(f"session socket failed: {exc}"))
        return fut

    def call(self, op: str, args: dict[str, Any] | None = None, timeout: float | None = None) -> Any:
        """Send one request and block until its reply (other threads may call meanwhile)."""
        return self.submit(op, args).result(timeout)

    def flush_releases(self) -> None:
        """Release Dist handles whose objects were garbage-collected (one fire-and-forget call)."""
        ids: list[int] = []
        while self.deferred_releases and len(ids) < 4096:
            ids.append(self.deferred_releases.popleft())
        if ids and self._closed is None:
            self.submit("dist_release", {"dists": ids})

    # --------------------------------------------------------------------- reader
    def _read_loop(self) -> None:
        error: SymphonyError = ConnectionLost("the worker closed the session connection")
        try:
            while True:
                header = _recv_exact(self._sock, protocol.HEADER_BYTES)
                if header is None:
                    break
                body = _recv_exact(self._sock, protocol.frame_length(header))
                if body is None:
                    break
                req_id, value, err = protocol.parse_reply(protocol.unpack_body(body))
                with self._lock:
                    entry = self._pending.pop(req_id, None) if isinstance(req_id, int) else None
                if entry is None:
                    if err is not None and req_id is None:
                        # An error not tied to a request (e.g. bad frame): the worker may close next.
                        error = from_wire(err.code, err.message)
                    continue
                op, fut = entry
                if err is not None:
                    fut.set_exception(from_wire(err.code, err.message, op))
                else:
                    fut.set_result(value)
        except protocol.ProtocolError as exc:
            error = ConnectionLost(f"undecodable reply from the worker: {exc}")
        except OSError as exc:
            error = ConnectionLost(f"session socket failed: {exc}")
        self._fail_all(error)

    def _fail_all(self, error: SymphonyError) -> None:
        with self._lock:
            if self._closed is None:
                self._closed = error
            pending, self._pending = self._pending, {}
        for _, fut in pending.values():
            if not fut.done():
                fut.set_exception(error)
