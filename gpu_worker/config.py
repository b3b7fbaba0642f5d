"""Worker configuration: one frozen dataclass built from CLI flags with environment defaults.

Everything a running worker needs to know is here, so tests and benchmarks can build a worker
without going through argv, and ``health`` can report what the worker runs with.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from gpu_worker.resource_model import RESERVE_FRACTION
from gpu_worker.stream_ledger import StreamBudget

REPO_ROOT = Path(__file__).resolve().parent.parent


def _env_bytes(name: str) -> int | None:
    """A byte count from the environment (``None`` when unset); a clear error when it is not one."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    if not raw.isdigit():
        raise SystemExit(f"gpu_worker: {name} must be a whole number of bytes, not {raw!r}")
    return int(raw)


def _env_path(name: str, default: str) -> str:
    value = os.environ.get(name)
    return value if value else str(REPO_ROOT / default)


@dataclass(frozen=True)
class SchedulerConfig:
    """Batch- and LIP-level scheduling knobs (docs/ARCHITECTURE.md §6)."""

    #: Token budget of one forward (decode tokens first, then prefill chunks).
    max_num_batched_tokens: int = 2048
    #: Most sequences in one forward.
    max_num_seqs: int = 64
    #: Longest wait for a fuller batch, in seconds (a cap on the proportional wait below).
    max_batch_wait_s: float = 0.05
    #: A batch waits for more calls at most this fraction of a forward's time (moving average).
    batch_wait_fraction: float = 0.25
    #: DRR quantum in tokens per unit of tenant weight and round.
    drr_quantum: int = 256
    #: While other tenants' calls are left out of a forward, a prefill chunk may raise its
    #: tenant's virtual token counter at most this many tokens (per unit of weight) above the
    #: lowest counter of the other contending tenants; ``None``: chunks sized by DRR alone.
    contended_prefill_slack: int | None = 32
    #: While other accounts are being served, one account (its tenants together; the name is
    #: older than that) takes no more seats (calls) of a forward than the widest of them, and at
    #: least this many; ``None``: no cap. Keeps the forward every tenant's next token waits for
    #: short.
    contended_seats_per_tenant: int | None = 1
    #: While more than one account has queued a call within the idle second, the prefill tokens
    #: one forward carries, all accounts together; each account takes at most its weighted fair
    #: share of them (``resource_model.Pool.fair_share``), and the rest of a long prompt follows
    #: in later forwards. ``None``: derived from measured forward cost (``Scheduler``
    #: ``contended_step_tokens``): the tokens a forward can carry and last at most
    #: ``contended_step_ratio`` decode-only forwards. One account alone gets the whole budget.
    contended_step_tokens: int | None = None
    #: How many decode-only forwards a contended forward may last (see above).
    contended_step_ratio: float = 2.0
    #: Most ``pred`` calls one session may have queued or running at once (a LIP's thread
    #: count); the same as the per-connection in-flight cap of the protocol.
    max_inflight_preds_per_session: int = 64
    #: A session blocked on brokered I/O longer than this has its private pages swapped out.
    io_swap_threshold_s: float = 0.5


@dataclass(frozen=True)
class ConnectionLimits:
    """What one session connection, and all of them together, may hold in the worker.

    A LIP is hostile code and its session socket is all it can reach: these bound what it can
    make the worker buffer or keep open, so a slow or hostile client costs only itself.
    """

    #: Unsent reply bytes above which the worker stops reading the connection (back-pressure),
    #: until they drain below a quarter of it. Replies of calls already in flight still go out.
    max_unsent_reply_bytes: int = 1024 * 1024
    #: Most open connections to one session's socket; more are refused (``EBUSY``) and closed.
    max_connections_per_session: int = 16
    #: A connection that has not sent a valid ``hello`` this long after connecting is closed.
    hello_timeout_s: float = 5.0
    #: A frame whose header arrived must be complete this long after, or the connection closes.
    frame_timeout_s: float = 10.0
    #: Bytes of large frames being received at once on one session's connections (announced
    #: lengths); a frame past it is refused (``EBUSY``) and its connection closed.
    max_partial_frame_bytes_per_session: int = 16 * 1024 * 1024
    #: The same bound over every connection of the worker.
    max_partial_frame_bytes: int = 256 * 1024 * 1024
    #: Most open session connections over the whole worker: with ``max_sessions`` sessions the
    #: per-session cap alone would allow thousands of descriptors, past a service's usual
    #: RLIMIT_NOFILE (the worker raises its soft limit to the hard one at start-up).
    max_connections: int = 2048

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if not value > 0:
                raise ValueError(f"{name} must be positive, not {value!r}")


@dataclass(frozen=True)
class GrammarConfig:
    """Budgets of one grammar compile (``grammar`` op): a hostile schema costs at most this."""

    #: Child processes that compile (a compile cannot be interrupted in-process; a child can be
    #: killed), a pool shared per account: one account compiles in at most its ceiling
    #: (``resource_model``, 1 of 2); at least 2, so one account never holds them all.
    processes: int = 2
    #: Seconds one compile may run before its child is killed and the call refused.
    timeout_s: float = 10.0
    #: After a compile of an account was killed for ``timeout_s``, the account's first-time
    #: compiles are refused (EBUSY) for this long (``grammar_backoff``); 0: never.
    kill_backoff_s: float = 20.0
    #: Each kill within this long of the account's previous one doubles the back-off, up to this.
    kill_backoff_max_s: float = 300.0
    #: Largest compiled grammar (xgrammar's own size estimate, bytes).
    max_bytes: int = 64 * 1024 * 1024
    #: Largest product of nested repetition bounds in a regex (``(a{1,20}){1,5}`` is 100), the
    #: count of a JSON schema's ``pattern`` included; checked before compiling.
    max_repeat: int = 256
    #: Deepest nesting of a JSON schema (objects and arrays), checked before compiling.
    max_depth: int = 32


@dataclass(frozen=True)
class WorkerConfig:
    """Static configuration of one worker process."""

    model_dir: str
    admin_socket: str
    sessions_dir: str
    kv_store_dir: str
    name: str = "local"
    kv_cache_gib: float = 1.0
    num_pages: int | None = None
    dtype: str = "auto"
    max_model_len: int = 4096
    #: On CPU, run the model compiled by vLLM (Dynamo + Inductor) instead of eagerly
    #: (gpu_worker/README.md, "Compiled forward"); ignored on a GPU.
    compile: bool = True
    #: Where compiled code is cached across restarts.
    compile_cache_dir: str = str(REPO_ROOT / "var" / "compile-cache")
    #: Host-memory tier size in pages (swap target for idle sessions and evicted files).
    host_pages: int = 4096
    #: Most of the device pool the pinned KV files of all tenants together may hold: each tenant's
    #: plan share bounds one tenant, this bounds many (one person may own several tenants).
    kv_pinned_fraction: float = 0.5
    #: Bytes the KV store may keep for named files (``PoolName.KV_STORE_BYTES``); ``None``: measured
    #: at start, the store's free disk plus what its files already hold (an object store: unbounded).
    kv_store_bytes: int | None = None
    #: Of the device pool, what no one account may hold (gpu_worker/resource_model.py): kept for
    #: the other accounts' prefills and decodes. 0 only on a worker that serves one account (a
    #: dedicated deployment, or a benchmark against a single-tenant baseline).
    kv_account_reserve: float = RESERVE_FRACTION
    #: The tenant-scoped automatic prefix cache (gpu_worker/kvfs/prefix.py).
    prefix_cache: bool = True
    #: Seconds a closed ``durable=False`` KV file keeps unwritten changes (``KVFS.write_idle``).
    kv_lazy_write_s: float = 120.0
    redis_url: str = "redis://127.0.0.1:6379/0"
    #: How Redis memory for retained event streams is sized and shared (gpu_worker/stream_ledger.py).
    stream_budget: StreamBudget = field(default_factory=StreamBudget)
    #: Seconds between live ``kv`` snapshot events of a running session.
    kv_event_interval_s: float = 0.5
    #: Most live Dist handles per session.
    max_dists_per_session: int = 4096
    #: Most concurrent sessions on this worker.
    max_sessions: int = 256
    #: Hard cap on one http_fetch response body (bytes) and its timeout (seconds).
    http_max_bytes: int = 4 * 1024 * 1024
    http_timeout_s: float = 30.0
    #: Bytes of unread channel messages one tenant may have queued here, all its run trees
    #: together (gpu_worker/channels.py).
    channel_bytes_per_tenant: int = 16 * 1024 * 1024
    #: Per-run traces (gpu_worker/tracing.py): off, sessions record no spans and their run's
    #: trace says so (``--trace off``, ``SYMPHONY_WORKER_TRACE=off``).
    trace: bool = True
    conn: ConnectionLimits = field(default_factory=ConnectionLimits)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    grammar: GrammarConfig = field(default_factory=GrammarConfig)


def connection_limits_from_env() -> ConnectionLimits:
    """:class:`ConnectionLimits` with each field overridden by ``SYMPHONY_WORKER_<FIELD>`` if set."""
    values: dict[str, Any] = {}  # int or float, as each field is typed
    for f in fields(ConnectionLimits):
        raw = os.environ.get(f"SYMPHONY_WORKER_{f.name.upper()}")
        if raw:
            values[f.name] = float(raw) if f.type == "float" else int(raw)
    return ConnectionLimits(**values)


def env_defaults() -> dict[str, object]:
    """Defaults taken from the environment (SYMPHONY_*, REDIS_URL)."""
    from gpu_worker.model_store import default_model_dir

    return {
        "model_dir": os.environ.get("SYMPHONY_MODEL") or str(default_model_dir()),
        "name": os.environ.get("SYMPHONY_WORKER_NAME") or "local",
        "admin_socket": _env_path("SYMPHONY_WORKER_ADMIN_SOCKET", "var/run/worker-admin.sock"),
        "sessions_dir": _env_path("SYMPHONY_SESSIONS_DIR", "var/run/sessions"),
        "kv_store_dir": _env_path("SYMPHONY_KV_STORE", "var/kvstore"),
        "compile": "off" if os.environ.get("SYMPHONY_COMPILE", "on").lower() in ("0", "false", "no", "off") else "on",
        "compile_cache_dir": _env_path("SYMPHONY_COMPILE_CACHE", "var/compile-cache"),
        "kv_cache_gib": float(os.environ.get("SYMPHONY_KV_CACHE_GIB", "1")),
        # A string, so the CLI checks it as it checks --kv-pinned-fraction (a fraction in [0, 1]).
        "kv_pinned_fraction": os.environ.get("SYMPHONY_KV_PINNED_FRACTION") or "0.5",
        "kv_store_bytes": _env_bytes("SYMPHONY_KV_STORE_BYTES"),
        "prefix_cache": os.environ.get("SYMPHONY_PREFIX_CACHE", "1").lower() not in ("0", "false", "no", "off"),
        "kv_lazy_write_s": float(os.environ.get("SYMPHONY_KV_LAZY_WRITE_S") or WorkerConfig.kv_lazy_write_s),
        "redis_url": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
        # A string, so the CLI checks it as it checks --trace (on or off).
        "trace": os.environ.get("SYMPHONY_WORKER_TRACE") or "on",
    }
