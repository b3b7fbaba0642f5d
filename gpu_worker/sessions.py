"""Sessions: one run's connection to the worker, its limits, metering and handles.

A session is created by the control plane (``create_session``) and owns one Unix socket under
the sessions dir; the sandbox connects with the session token. Everything a LIP can name (KV
handles, Dist handles, grammar states, bias vectors) is scoped to its session, and through the KVFS
``Owner(tenant, session_id)`` to its tenant.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import torch

from gpu_worker.bias_vectors import BiasStore
from gpu_worker.dists import DistStore
from gpu_worker.grammar import GrammarHandles
from gpu_worker.kvfs import Owner, TenantQuota
from gpu_worker.protocol import ErrorCode, KvQuotaLimits, ProtocolError, RunLimits
from gpu_worker.tracing import SessionTrace
from gpu_worker.usage import Usage

if TYPE_CHECKING:
    from gpu_worker.connections import Conn

MAX_RESULT_BYTES = 1024 * 1024
#: Bytes a run may send to its client (``send_to_user``, as stored in its event stream) when the
#: control plane states no ``max_stream_bytes``: every stream is bounded.
DEFAULT_MAX_STREAM_BYTES = 64 * 1024 * 1024


def _bad(message: str) -> ProtocolError:
    return ProtocolError(ErrorCode.BAD_ARGS, message)


def _opt_int(value: object, key: str, lo: int = 0) -> int | None:
    """A limit's value read from the wire (hostile until checked): ``None`` or an int >= ``lo``."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < lo:
        raise _bad(f"limits.{key} must be an integer >= {lo}")
    return value


def _opt_share(value: object, key: str) -> float | None:
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value <= 1:
        raise _bad(f"limits.{key} must be a fraction in [0, 1]")
    return float(value)


#: The keys of a tenant's KV quota, in session limits and in the admin ``kv_pin`` op.
QUOTA_KEYS = tuple(KvQuotaLimits.__annotations__)


def parse_tenant_quota(limits: KvQuotaLimits) -> TenantQuota:
    """The tenant-wide KV bounds in a limits map (the plan's, the same for every run); the map
    comes off the wire, so each value is checked here."""
    return TenantQuota(
        stored_bytes=_opt_int(limits.get("max_stored_bytes"), "max_stored_bytes"),
        pinned_device_share=_opt_share(limits.get("kv_pinned_share"), "kv_pinned_share"),
        host_share=_opt_share(limits.get("kv_host_share"), "kv_host_share"),
        max_files=_opt_int(limits.get("max_kv_files"), "max_kv_files"),
    )


@dataclass(frozen=True)
class SessionLimits:
    """Per-run limits from the control plane; ``None`` means unlimited."""

    max_tokens: int | None = None
    max_pages: int | None = None
    deadline_s: float | None = None
    allowed_hosts: tuple[str, ...] = ()
    max_kv_bytes: int | None = None
    #: The tenant's plan bounds on its named KV files, the same for each of its runs: stored
    #: bytes, shares of the device pool (pinned files) and of host memory, a file count
    #: (``QUOTA_KEYS`` in the map; gpu_worker/kvfs/quota.py).
    quota: TenantQuota = field(default_factory=TenantQuota)
    weight: float = 1.0
    #: Bytes the run may send with ``send_to_user`` in all (the plan's ``stream_bytes_per_run``).
    max_stream_bytes: int = DEFAULT_MAX_STREAM_BYTES
    #: Whether the run's executor serves its ``spawn`` and ``child_cancel`` (the control plane's
    #: executor does, ``api/services/procs.py``; a session opened by hand has nobody to ask).
    spawn: bool = False
    #: The account the run's tenant counts against (a person's tenants together): pools every
    #: tenant shares are bounded per account (gpu_worker/resource_model.py). ``None``: the
    #: tenant is its own account.
    account: str | None = None

    @classmethod
    def parse(cls, wire: object) -> SessionLimits:
        """``create_session``'s ``limits`` (``protocol.RunLimits``) as it came off the wire:
        every value is checked, a bad one is EINVAL naming its key."""
        if wire is None:
            wire = {}
        if not isinstance(wire, dict):
            raise _bad("limits must be a map")
        limits = cast(RunLimits, wire)  # its keys; each value is checked below
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
        spawn = limits.get("spawn", False)
        if not isinstance(spawn, bool):
            raise _bad("limits.spawn must be a boolean")
        account = limits.get("account")
        if account is not None and (not isinstance(account, str) or not 0 < len(account) <= 64):
            raise _bad("limits.account must be a string of 1 to 64 characters")
        return cls(
            max_tokens=_opt_int(limits.get("max_tokens"), "max_tokens"),
            max_pages=_opt_int(limits.get("max_pages"), "max_pages"),
            deadline_s=float(deadline) if deadline is not None else None,
            allowed_hosts=tuple(hosts),
            max_kv_bytes=_opt_int(limits.get("max_kv_bytes"), "max_kv_bytes"),
            quota=parse_tenant_quota(limits),
            weight=float(weight),
            max_stream_bytes=_opt_int(limits.get("max_stream_bytes"), "max_stream_bytes") or DEFAULT_MAX_STREAM_BYTES,
            spawn=spawn,
            account=account,
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
class WorkerSession:
    """State of one run on this worker."""

    session_id: str
    tenant: str
    run_id: str
    limits: SessionLimits
    socket_path: str
    max_dists: int
    #: The run tree (its root run's id) whose channels the session shares; "" means its own run.
    tree: str = ""
    token: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    created: float = field(default_factory=time.monotonic)
    usage: Usage = field(default_factory=Usage)
    #: Where its time goes, for the run's trace (bounded, gpu_worker/tracing.py).
    trace: SessionTrace = field(default_factory=SessionTrace)
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
    #: Open connections to the session socket (``connections.Conn``), authenticated or not.
    conns: set[Conn] = field(default_factory=set)
    #: Announced bytes of this session's large frames still arriving (``connections``).
    partial_frame_bytes: int = 0
    tasks: set[asyncio.Task] = field(default_factory=set)
    #: Child runs this session's LIP spawned: the only ids its ``child_wait`` / ``child_cancel`` take.
    children: set[str] = field(default_factory=set)
    #: Spawns of this session's LIP sent to the control plane and not answered yet: a child on its
    #: way counts as a run that may still send on the tree's channels.
    spawning: int = 0

    @property
    def account(self) -> str:
        """The account that bounds on pools every tenant shares apply to: the one the control
        plane named, else the tenant alone."""
        return self.limits.account or f"tenant:{self.tenant}"

    def __post_init__(self) -> None:
        self.tree = self.tree or self.run_id or self.session_id
        self.owner = Owner(self.tenant, self.session_id)
        self.weight = self.limits.weight
        self.dists = DistStore(self.max_dists)
        self.grammars = GrammarHandles()
        self.biases = BiasStore()
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

    def reserve_tokens_upto(self, least: int, most: int) -> int:
        """Admit between ``least`` and ``most`` more tokens against ``max_tokens`` (counting calls
        still in flight), as many as it leaves room for (a multi-step ``pred``: its steps stop
        where the budget does); QUOTA when not even ``least`` fit. Returns how many."""
        cap = self.limits.max_tokens
        with self._lock:
            room = most if cap is None else cap - self.usage.total_tokens - self.reserved_tokens
            n = max(least, min(most, room))
            self._reserve(cap, n)
        return n

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

    def spend_stream_bytes(self, n: int, *, to_user: bool = True) -> None:
        """Count ``n`` bytes sent to the client against ``max_stream_bytes``; EDQUOT past it
        (nothing is sent then, and what was sent before stays in the stream). ``to_user``
        false: an event the run's stream records but the LIP did not send to its user (a
        channel message): it counts bytes, not ``streamed_events`` or the first-output time."""
        cap = self.limits.max_stream_bytes
        with self._lock:
            sent = self.usage.streamed_bytes
            if sent + n > cap:
                raise ProtocolError(
                    ErrorCode.QUOTA,
                    f"stream budget exceeded: this run sent {sent} bytes to its client and {n} more"
                    f" would pass its limit of {cap} bytes (the plan's stream_bytes_per_run, per run;"
                    " the account-wide bound on retained event streams applies besides)",
                )
            self.usage.streamed_bytes += n
            if not to_user:
                return
            self.usage.streamed_events += 1
            if not self.usage.first_stream_at:
                self.usage.first_stream_at = time.time()

    def refund_stream_bytes(self, n: int) -> None:
        """Give back bytes counted by ``spend_stream_bytes(to_user=False)`` for an event that
        was not sent after all."""
        with self._lock:
            self.usage.streamed_bytes = max(0, self.usage.streamed_bytes - n)

    def on_tokens(self, n: int, prefill: bool | None = None) -> None:
        """Called by the engine thread per committed chunk (metering); ``prefill``: the chunk is
        part of a multi-token call (see ``Usage.add_tokens``)."""
        with self._lock:
            self.usage.add_tokens(n, prefill)

    def on_cached_tokens(self, n: int) -> None:
        """Called by the engine thread when ``n`` prompt tokens were mapped from the prefix
        cache instead of computed: metered as cached, not as prefill."""
        with self._lock:
            self.usage.cached_tokens += n

    def set_result(self, result: Any, error: object = None) -> None:
        import msgpack

        if self.finished:
            raise ProtocolError(ErrorCode.BAD_ARGS, "finish was already called")
        if len(msgpack.packb(result, use_bin_type=True)) > MAX_RESULT_BYTES:
            raise ProtocolError(ErrorCode.BAD_ARGS, f"result larger than {MAX_RESULT_BYTES} bytes")
        self.result = result
        self.error = None if error is None else str(error)[:10_000]
        self.finished = True


class SessionTable(dict[str, WorkerSession]):
    """The worker's live sessions by id. Made before the scheduler and the worker: the scheduler
    reads :meth:`active_ids` (whose calls a batch waits for), the worker adds and removes."""

    def active_ids(self) -> list[str]:
        """Sessions that can issue a ``pred`` now: connected, not blocked in brokered I/O, not ended."""
        return [s.session_id for s in list(self.values()) if s.conns and s.io_waits == 0 and not s.ended]
