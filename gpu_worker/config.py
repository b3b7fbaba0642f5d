"""Worker configuration: one frozen dataclass built from CLI flags with environment defaults.

Everything a running worker needs to know is here, so tests and benchmarks can build a worker
without going through argv, and ``health`` can report what the worker runs with.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def _env_path(name: str, default: str) -> str:
    value = os.environ.get(name)
    return value if value else str(REPO_ROOT / default)


@dataclass(frozen=True)
class SchedulerConfig:
    """Batch- and LIP-level scheduling knobs (DESIGN.md §5)."""

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
    #: Most ``pred`` calls one session may have queued or running at once (a LIP's thread
    #: count); the same as the per-connection in-flight cap of the protocol.
    max_inflight_preds_per_session: int = 64
    #: A session blocked on brokered I/O longer than this has its private pages swapped out.
    io_swap_threshold_s: float = 0.5


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
    #: Host-memory tier size in pages (swap target for idle sessions and evicted files).
    host_pages: int = 4096
    redis_url: str = "redis://127.0.0.1:6379/0"
    #: Seconds between live ``kv`` snapshot events of a running session.
    kv_event_interval_s: float = 0.5
    #: Most live Dist handles per session.
    max_dists_per_session: int = 4096
    #: Most concurrent sessions on this worker.
    max_sessions: int = 256
    #: Hard cap on one http_fetch response body (bytes) and its timeout (seconds).
    http_max_bytes: int = 4 * 1024 * 1024
    http_timeout_s: float = 30.0
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)


def env_defaults() -> dict[str, object]:
    """Defaults taken from the environment (SYMPHONY_*, REDIS_URL)."""
    from gpu_worker.model_store import default_model_dir

    return {
        "model_dir": os.environ.get("SYMPHONY_MODEL") or str(default_model_dir()),
        "name": os.environ.get("SYMPHONY_WORKER_NAME") or "local",
        "admin_socket": _env_path("SYMPHONY_WORKER_ADMIN_SOCKET", "var/run/worker-admin.sock"),
        "sessions_dir": _env_path("SYMPHONY_SESSIONS_DIR", "var/run/sessions"),
        "kv_store_dir": _env_path("SYMPHONY_KV_STORE", "var/kvstore"),
        "kv_cache_gib": float(os.environ.get("SYMPHONY_KV_CACHE_GIB", "1")),
        "redis_url": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
    }
