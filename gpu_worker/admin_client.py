"""Blocking client for the worker's admin socket (control plane -> worker).

Small and dependency-free apart from ``msgpack`` so the Celery executor, the API and tests can
use it. One request per connection keeps it trivially thread-safe; admin calls are rare.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any

from gpu_worker import protocol
from gpu_worker.protocol import ErrorCode, ProtocolError


@dataclass(frozen=True)
class SessionInfo:
    """What the sandbox needs to reach its session: socket path (mounted) and token (env)."""

    session_id: str
    socket_path: str
    token: str


@dataclass(frozen=True)
class SessionEnd:
    """Usage counters, the LIP's ``finish`` result and an error message if it failed."""

    usage: dict[str, Any]
    result: Any
    error: str | None


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ProtocolError(ErrorCode.IO, "worker closed the admin connection")
        buf.extend(chunk)
    return bytes(buf)


class AdminClient:
    """Calls admin ops; every error reply is raised as :class:`protocol.ProtocolError`."""

    def __init__(self, socket_path: str, timeout: float = 30.0) -> None:
        self.socket_path = str(socket_path)
        self.timeout = timeout

    def call(self, op: str, args: dict[str, Any] | None = None) -> Any:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(self.timeout)
            sock.connect(self.socket_path)
            sock.sendall(protocol.pack(protocol.request(1, op, args)))
            length = protocol.frame_length(_recv_exact(sock, protocol.HEADER_BYTES))
            _, value, error = protocol.parse_reply(protocol.unpack_body(_recv_exact(sock, length)))
        if error is not None:
            raise error
        return value

    def create_session(self, tenant: str, run_id: str, limits: dict[str, Any] | None = None) -> SessionInfo:
        out = self.call("create_session", {"tenant": tenant, "run_id": run_id, "limits": limits or {}})
        return SessionInfo(out["session_id"], out["socket_path"], out["token"])

    def end_session(self, session_id: str) -> SessionEnd:
        out = self.call("end_session", {"session_id": session_id})
        return SessionEnd(out["usage"], out.get("result"), out.get("error"))

    def kv_list(self, tenant: str | None = None) -> list[dict[str, Any]]:
        return self.call("kv_list", {"tenant": tenant} if tenant is not None else {})

    def kv_evict(self, tenant: str, name: str) -> None:
        self.call("kv_evict", {"tenant": tenant, "name": name})

    def kv_delete(self, tenant: str, name: str) -> None:
        self.call("kv_delete", {"tenant": tenant, "name": name})

    def kv_delete_tenant(self, tenant: str) -> list[str]:
        """Delete every KV file of ``tenant`` here and in the KV store; the names deleted."""
        return self.call("kv_delete_tenant", {"tenant": tenant})["deleted"]

    def kv_pin(self, tenant: str, name: str, pinned: bool) -> None:
        self.call("kv_pin", {"tenant": tenant, "name": name, "pinned": pinned})

    def health(self) -> dict[str, Any]:
        return self.call("health")

    def stats(self) -> dict[str, Any]:
        return self.call("stats")
