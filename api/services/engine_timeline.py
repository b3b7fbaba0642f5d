"""A worker's engine timeline, for staff: its last forwards as the worker keeps them
(gpu_worker/engine_timeline.py), read over its admin socket (``engine_timeline``) by this
host or by the worker's own executor (the ``api.kv_admin`` task, api/services/kvfiles.py).

What it shows names accounts and every tenant's load on the worker: staff only
(``GET /staff/workers/<name>/timeline``), never a tenant.
"""

from __future__ import annotations

from typing import Any

from api.services import kvfiles, routing
from gpu_worker import engine_timeline, protocol

#: The process/track names of the Chrome trace-event format's timeline.
_PID = 1
_TID = 1


class UnknownWorker(Exception):
    """No live worker of that name (no unexpired heartbeat)."""


def read(worker: str) -> dict[str, Any]:
    """The worker's timeline: ``{worker, capacity, recorded, forwards: [...]}``, oldest first;
    raises :class:`UnknownWorker`, or ``kvfiles.WorkerUnavailable`` when it cannot be asked."""
    if worker not in {w.name for w in routing.live_workers()}:
        raise UnknownWorker(worker)
    reply = kvfiles.call_worker(protocol.EngineTimeline(), worker=worker)
    return {
        "worker": worker,
        "capacity": reply["capacity"],
        "recorded": reply["recorded"],
        "forwards": engine_timeline.expand(reply),
    }


def chrome_trace(timeline: dict[str, Any]) -> dict[str, Any]:
    """The timeline in the Chrome trace-event format (Perfetto, chrome://tracing): one complete
    event per forward, microseconds since the oldest forward kept, and a counter track of the
    batch size."""
    forwards = timeline["forwards"]
    base = forwards[0]["start"] if forwards else 0.0
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": _PID, "args": {"name": f"worker {timeline['worker']}"}},
        {"name": "thread_name", "ph": "M", "pid": _PID, "tid": _TID, "args": {"name": "engine"}},
    ]
    for f in forwards:
        ts = round((f["start"] - base) * 1e6, 3)
        args = {k: f[k] for k in ("batch_size", "prompt_tokens", "decode_tokens", "sessions", "accounts")}
        args["tokens_per_account"] = f["tokens_per_account"]
        events.append(
            {
                "name": "forward",
                "cat": "engine",
                "ph": "X",
                "ts": ts,
                "dur": round(f["duration_s"] * 1e6, 3),
                "pid": _PID,
                "tid": _TID,
                "args": args,
            }
        )
        events.append({"name": "batch", "ph": "C", "ts": ts, "pid": _PID, "args": {"size": f["batch_size"]}})
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "worker": timeline["worker"],
            "started_at": base,
            "capacity": timeline["capacity"],
            "recorded": timeline["recorded"],
        },
    }
