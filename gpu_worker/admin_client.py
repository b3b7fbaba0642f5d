"""Blocking client for the worker's admin socket (control plane -> worker).

Small and dependency-free apart from ``msgpack`` so the Celery executor, the API and tests can
use it. One request per connection keeps it trivially thread-safe; admin calls are rare.
"""

from __future__ import annotations

import socket
from typing import Any

from gpu_worker import protocol
from gpu_worker.protocol import ErrorCode, ProtocolError

#: What the sandbox needs to reach its session: socket path (mounted) and token (env).
SessionAccess = protocol.SessionCreated
#: Usage counters, the LIP's ``finish`` result and an error message if it failed.
SessionEnd = protocol.SessionEnded


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

    def run(self, args: protocol.Args) -> Any:
        """One op, its arguments built from its definition in ``protocol.ADMIN_OPS``."""
        return self.call(args.OP, args.to_wire())

    def create_session(
        self,
        tenant: str,
        run_id: str,
        limits: protocol.RunLimits | None = None,
        tree: str | None = None,
        trace: protocol.TraceContext | None = None,
    ) -> SessionAccess:
        """``tree``: the run tree's root run id (default: ``run_id``); runs of one tenant and one
        tree share channels. ``trace``: the run's W3C trace context (its trace, the run's span)."""
        out = self.run(
            protocol.CreateSession(tenant=tenant, run_id=run_id, limits=limits or {}, tree=tree, trace=trace)
        )
        return SessionAccess.from_wire(out)

    def engine_timeline(self, limit: int | None = None) -> protocol.EngineTimelineReply:
        """The engine's last forwards (at most ``limit``; default: the whole ring)."""
        args = protocol.EngineTimeline() if limit is None else protocol.EngineTimeline(limit=limit)
        return protocol.EngineTimelineReply.from_wire(self.run(args))

    def end_session(self, session_id: str) -> SessionEnd:
        return SessionEnd.from_wire(self.run(protocol.EndSession(session_id=session_id)))

    def kv_list(self, tenant: str | None = None) -> list[dict[str, Any]]:
        return self.run(protocol.KvList(tenant=tenant))

    def kv_evict(self, tenant: str, name: str) -> None:
        self.run(protocol.KvEvict(tenant=tenant, name=name))

    def kv_delete(self, tenant: str, name: str) -> None:
        self.run(protocol.KvDelete(tenant=tenant, name=name))

    def kv_delete_tenant(self, tenant: str) -> list[str]:
        """Delete every KV file of ``tenant`` here and in the KV store; the names deleted."""
        return protocol.TenantDeleted.from_wire(self.run(protocol.KvDeleteTenant(tenant=tenant))).deleted

    def kv_pin(self, tenant: str, name: str, pinned: bool, quota: protocol.KvQuotaLimits | None = None) -> None:
        """``quota``: the tenant's plan bounds on KV files, set before the pin is checked."""
        self.run(protocol.AdminKvPin(tenant=tenant, name=name, pinned=pinned, quota=quota))

    def health(self) -> dict[str, Any]:
        return self.run(protocol.Health())

    def stats(self) -> dict[str, Any]:
        return self.run(protocol.Stats())
