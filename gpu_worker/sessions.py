"""Sessions: one run's connection to the worker, its limits, metering and handles.

A session is created by the control plane (``create_session``) and owns one Unix socket under
the sessions dir; the sandbox connects with the session token. Everything a LIP can name (KV
handles, Dist handles, grammar states) is scoped to its session, and through the KVFS
``Owner(tenant, session_id)`` to its tenant.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from gpu_worker.dists import DistStore
from gpu_worker.grammar import GrammarHandles
from gpu_worker.kvfs import Owner
from gpu_worker.protocol import ErrorCode, ProtocolError
from gpu_worker.usage import Usage

MAX_RESULT_BYTES = 1024 * 1024


def _bad(message: str) -> ProtocolError:
    return ProtocolError(ErrorCode.BAD_ARGS, message)


def _opt_int(limits: dict[str, Any], key: str, lo: int = 0) -> int | None:
    value = limits.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < lo:
        raise _bad(f"limits.{key} must be an integer >= {lo}")
    return value


@dataclass(frozen=True)
class SessionLimits:
    """Per-run limits from the control plane; ``None`` means unlimited."""

    max_tokens: int | None = None
    max_pages: int | None = None
    deadline_s: float | None = None
    allowed_hosts: tuple[str, ...] = ()
    max_kv_bytes: int | None = None
    #: The tenant's budget for persistent KV files (plan); applies to the whole tenant.
    max_stored_bytes: int | None = None
    weight: float = 1.0

    @classmethod
    def parse(cls, limits: object) -> SessionLimits:
        if limits is None:
            limits = {}
        if not isinstance(limits, dict):
            raise _bad("limits must be a map")
        deadline = limits.get("deadline_s")
        if deadline is not None and (
            not isinstance(deadline, int | float) or isinstance(deadline, bool) or deadline <= 0
        ):
            raise _bad("limits.deadline_s must be a positive number")
        hosts = limits.get("allowed_hosts") or []
        if not isinstance(hosts, list | tuple) or not all(isinstance(h, str) and 0 < len(h) <= 260 for h in hosts):
            raise _bad("limits.allowed_hosts must be a list of host[:port] strings")
        weight = limits.get("weight", 1.0)
        if not isinstance(weight, int | float) or isinstance(weight, bool) or not 0 < weight <= 1000:
            raise _bad("limits.weight must be a number in (0, 1000]")
        return cls(
            max_tokens=_opt_int(limits, "max_tokens"),
            max_pages=_opt_int(limits, "max_pages"),
            deadline_s=float(deadline) if deadline is not None else None,
            allowed_hosts=tuple(hosts),
            max_kv_bytes=_opt_int(limits, "max_kv_bytes"),
            max_stored_bytes=_opt_int(limits, "max_stored_bytes"),
            weight=float(weight),
        )

    def page_cap(self, page_bytes: int) -> int | None:
        """The session's device page cap: ``max_pages`` and ``max_kv_bytes`` combined."""
        caps = [
            c
            for c in (self.max_pages, None if self.max_kv_bytes is None else self.max_kv_bytes // page_bytes)
            if c is not None
        ]
        return min(caps) if caps else None


@dataclass(eq=False)
class Session:
    """State of one run on this worker."""

    session_id: str
    tenant: str
    run_id: str
    limits: SessionLimits
    socket_path: str
    max_dists: int
    token: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    created: float = field(default_factory=time.monotonic)
    usage: Usage = field(default_factory=Usage)
    result: Any = None
    error: str | None = None
    finished: bool = False
    ended: bool = False
    swapped: bool = False
    io_waits: int = 0
    swaps: int = 0
    reserved_tokens: int = 0
    inflight_preds: int = 0
    server: asyncio.AbstractServer | None = None
    writers: set[asyncio.StreamWriter] = field(default_factory=set)
    tasks: set[asyncio.Task] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.owner = Owner(self.tenant, self.session_id)
        self.weight = self.limits.weight
        self.dists = DistStore(self.max_dists)
        self.grammars = GrammarHandles()
        self._lock = threading.Lock()
        self.generator = torch.Generator().manual_seed(secrets.randbits(63))
        self.deadline = None if self.limits.deadline_s is None else self.created + self.limits.deadline_s

    def time_left(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()

    def check_deadline(self) -> None:
        left = self.time_left()
        if left is not None and left <= 0:
            raise self.deadline_error()

    def deadline_error(self) -> ProtocolError:
        return ProtocolError(ErrorCode.TIMEOUT, f"run deadline of {self.limits.deadline_s}s passed")

    def reserve_tokens(self, n: int) -> None:
        """Admit ``n`` more tokens against ``max_tokens`` (counting calls still in flight)."""
        cap = self.limits.max_tokens
        with self._lock:
            self._reserve(cap, n)

    def _reserve(self, cap: int | None, n: int) -> None:
        if cap is not None and self.usage.total_tokens + self.reserved_tokens + n > cap:
            raise ProtocolError(
                ErrorCode.QUOTA,
                f"token budget exceeded: {self.usage.total_tokens} used"
                f" + {self.reserved_tokens} in flight + {n} > {cap}",
            )
        self.reserved_tokens += n

    def unreserve_tokens(self, n: int) -> None:
        with self._lock:
            self.reserved_tokens = max(0, self.reserved_tokens - n)

    def on_tokens(self, n: int) -> None:
        """Called by the engine thread per committed chunk (metering)."""
        with self._lock:
            self.usage.add_tokens(n)

    def set_result(self, result: Any, error: object = None) -> None:
        import msgpack

        if self.finished:
            raise ProtocolError(ErrorCode.BAD_ARGS, "finish was already called")
        if len(msgpack.packb(result, use_bin_type=True)) > MAX_RESULT_BYTES:
            raise ProtocolError(ErrorCode.BAD_ARGS, f"result larger than {MAX_RESULT_BYTES} bytes")
        self.result = result
        self.error = None if error is None else str(error)[:10_000]
        self.finished = True
