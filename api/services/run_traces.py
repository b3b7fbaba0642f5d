"""Run traces: what a run's executor records when the run ends, and the tree
``GET /runs/<id>/trace`` serves (docs/ARCHITECTURE.md, "Traces").

Recorded (:func:`recorded`, stored by ``finish_run`` in ``RunTrace``): the executor's marks (the
worker session's creation and end, the sandbox's start, warm or cold, and its run) and the
worker's spans of the session (``gpu_worker/tracing.py``: syscalls with their queue wait and
forward share, I/O and channel waits, KV moves), clipped to the worker's bounds again here so a
stored trace stays bounded whatever sent it.

A worker started with ``--trace off`` sends its session's bounds and ``enabled: false``, no
spans: the tree then says ``worker_tracing: "off"`` (and so does the session's span), and shows
the control plane's own marks as ever.

Built at read time (:func:`trace_tree`): the run's own times (created, started, finished), the
routing decision (its worker), its children and its usage come from its rows, so nothing is
stored twice. Every span is the run's own or its children's; of the calls a ``pred`` shared a
forward with, a span holds counts only.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from django.utils import timezone

from api.models import Run, RunTrace, UsageRecord
from gpu_worker.tracing import MAX_BUCKETS, MAX_SPANS

#: The stored format's version (``RunTrace.data["version"]``).
VERSION = 1
#: Span kinds the control plane adds (the worker's are in gpu_worker/tracing.py).
RUN, CONTROL, SANDBOX, WORKER, CHILD = "run", "control", "sandbox", "worker", "child"
#: Children listed in a run's trace (the rest are counted in ``children_left_out``).
MAX_CHILD_SPANS = 100
#: Attribute values longer than this are cut (a worker span's attributes are numbers and names).
MAX_ATTR_CHARS = 200


@dataclass
class ExecutorMarks:
    """What the executor saw of a run, as Unix times and seconds (``execute`` records them)."""

    session_created: tuple[float, float] | None = None
    #: When the launcher was called, and its result's seconds to the program's start and run.
    launched_at: float | None = None
    sandbox_start_s: float = 0.0
    sandbox_run_s: float = 0.0
    #: A warm slot of the pool (True), a fresh container (False), or not a sandbox (None: the
    #: built-in program, run in-process).
    warm: bool | None = None
    session_ended: tuple[float, float] | None = None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _scalar_attrs(attrs: Any) -> dict[str, Any]:
    if not isinstance(attrs, dict):
        return {}
    out: dict[str, Any] = {}
    for key, value in list(attrs.items())[:16]:
        if isinstance(value, bool | int | float) and (not isinstance(value, float) or math.isfinite(value)):
            out[str(key)[:64]] = value
        elif isinstance(value, str):
            out[str(key)[:64]] = value[:MAX_ATTR_CHARS]
    return out


def _clip_worker(trace: Any) -> dict[str, Any]:
    """The worker's ``SessionEnded.trace`` within its documented bounds, malformed parts left out."""
    if not isinstance(trace, dict) or _number(trace.get("started_at")) is None:
        return {}
    spans = []
    for span in (trace.get("spans") or [])[:MAX_SPANS]:
        if isinstance(span, dict) and None not in (_number(span.get("start_s")), _number(span.get("end_s"))):
            spans.append(
                {
                    "kind": str(span.get("kind", ""))[:32],
                    "name": str(span.get("name", ""))[:64],
                    "start_s": span["start_s"],
                    "end_s": span["end_s"],
                    "attrs": _scalar_attrs(span.get("attrs")),
                }
            )
    buckets = []
    for bucket in (trace.get("buckets") or [])[:MAX_BUCKETS]:
        fields = ("second", "count", "duration_s", "queue_wait_s", "tokens", "end_s")
        if isinstance(bucket, dict) and all(_number(bucket.get(f)) is not None for f in fields):
            buckets.append(
                {"kind": str(bucket.get("kind", ""))[:32], "name": str(bucket.get("name", ""))[:64]}
                | {f: bucket[f] for f in fields}
            )
    return {
        "started_at": trace["started_at"],
        "duration_s": _number(trace.get("duration_s")) or 0.0,
        # A worker of before the switch sends no ``enabled``: it traced.
        "enabled": trace.get("enabled") is not False,
        "spans": spans,
        "buckets": buckets,
        "dropped": int(_number(trace.get("dropped")) or 0),
    }


def recorded(marks: ExecutorMarks, worker_trace: Any) -> dict[str, Any]:
    """What ``finish_run`` stores for the run (``RunTrace.data``)."""
    return {"version": VERSION, "executor": asdict(marks), "worker": _clip_worker(worker_trace)}


def store(run: Run, data: dict[str, Any]) -> None:
    """Keep the run's trace (a redelivered finish overwrites it). Called inside finish_run's
    transaction, so a run that has ended has its trace. One ``INSERT ... ON CONFLICT`` statement
    (``update_or_create`` took six with its savepoints: every /v1 request pays it)."""
    RunTrace.objects.bulk_create(
        [RunTrace(run=run, data=data)], update_conflicts=True, unique_fields=["run"], update_fields=["data"]
    )


class _Tree:
    """Spans with ids and parents, times in seconds since the run was created."""

    def __init__(self, base: float) -> None:
        self.base = base
        self.spans: list[dict[str, Any]] = []

    def add(
        self, name: str, kind: str, start: float, end: float, parent: int | None, busy_s: float | None = None, **attrs
    ) -> int:
        end = max(end, start)
        span_id = len(self.spans) + 1
        self.spans.append(
            {
                "id": span_id,
                "parent": parent,
                "name": name,
                "kind": kind,
                "start_s": round(start - self.base, 6),
                "end_s": round(end - self.base, 6),
                "duration_s": round(end - start if busy_s is None else busy_s, 6),
                "attrs": attrs,
            }
        )
        return span_id


def _usage_attrs(run: Run) -> dict[str, Any]:
    record = UsageRecord.objects.filter(run=run).first()
    if record is None:
        return {}
    return {field: getattr(record, field) for field in UsageRecord.METERED if field != "kv_gib_hours"}


def _add_executor(tree: _Tree, parent: int, marks: dict[str, Any], worker_trace: dict[str, Any], worker: str) -> None:
    created, ended = marks.get("session_created"), marks.get("session_ended")
    start = created[0] if created else None
    end = ended[1] if ended else None
    launched = marks.get("launched_at")
    if start is None:
        start = launched if launched is not None else worker_trace.get("started_at")
    if start is None:
        return
    if end is None:
        end = start + (worker_trace.get("duration_s") or 0.0)
    execute = tree.add("execute", CONTROL, start, end, parent, worker=worker)
    if created:
        tree.add("session.create", CONTROL, created[0], created[1], execute)
    if launched is not None:
        ready = launched + marks.get("sandbox_start_s", 0.0)
        warm = marks.get("warm")
        if warm is None:
            tree.add("program.run", CONTROL, ready, ready + marks.get("sandbox_run_s", 0.0), execute, in_process=True)
        else:
            tree.add("sandbox.start", SANDBOX, launched, ready, execute, warm=bool(warm))
            tree.add("sandbox.run", SANDBOX, ready, ready + marks.get("sandbox_run_s", 0.0), execute)
    if worker_trace:
        wall0 = worker_trace["started_at"]
        on = worker_trace.get("enabled", True)
        session = tree.add(
            "worker.session", WORKER, wall0, wall0 + worker_trace["duration_s"], execute, tracing=_tracing(on)
        )
        for span in worker_trace["spans"]:
            tree.add(
                span["name"], span["kind"], wall0 + span["start_s"], wall0 + span["end_s"], session, **span["attrs"]
            )
        for bucket in worker_trace["buckets"]:
            tree.add(
                bucket["name"],
                bucket["kind"],
                wall0 + bucket["second"],
                wall0 + bucket["end_s"],
                session,
                busy_s=bucket["duration_s"],
                aggregated=True,
                count=bucket["count"],
                queue_wait_s=round(bucket["queue_wait_s"], 6),
                tokens=bucket["tokens"],
            )
    if ended:
        tree.add("session.end", CONTROL, ended[0], ended[1], execute)


def _tracing(enabled: bool | None) -> str | None:
    """What a tree says of the worker's tracing: ``on``, ``off``, or ``None`` (no worker trace:
    the run has not ended, or ran in-process)."""
    return None if enabled is None else ("on" if enabled else "off")


def trace_tree(run: Run) -> dict[str, Any]:
    """The run's trace as one tree of spans (the JSON ``GET /runs/<id>/trace`` answers)."""
    now = timezone.now().timestamp()
    base = run.created_at.timestamp()
    tree = _Tree(base)
    finished = run.finished_at.timestamp() if run.finished_at else None
    root = tree.add("run", RUN, base, finished or now, None, status=run.status)
    started = run.started_at.timestamp() if run.started_at else None
    if started is not None or run.status == "queued":
        tree.add("queued", CONTROL, base, started or now, root, worker=run.worker)
    stored = RunTrace.objects.filter(run=run).values_list("data", flat=True).first()
    worker_trace: dict[str, Any] = {}
    if stored:
        worker_trace = stored.get("worker") or {}
        _add_executor(tree, root, stored.get("executor") or {}, worker_trace, run.worker)
    children = Run.objects.filter(parent=run, tenant_id=run.tenant_id).order_by("created_at")
    for child in children[:MAX_CHILD_SPANS]:
        child_end = child.finished_at.timestamp() if child.finished_at else now
        tree.add("child", CHILD, child.created_at.timestamp(), child_end, root, run=str(child.pk), status=child.status)
    if finished is not None:
        tree.add("end", CONTROL, finished, finished, root, status=run.status, **_usage_attrs(run))
    return {
        "run": str(run.pk),
        "status": run.status,
        "created_at": run.created_at.isoformat(),
        "complete": bool(stored),
        "worker_tracing": _tracing(worker_trace.get("enabled", True) if worker_trace else None),
        "spans_kept": MAX_SPANS,
        "dropped": int(worker_trace.get("dropped", 0)),
        "children_left_out": max(0, children.count() - MAX_CHILD_SPANS),
        "spans": tree.spans,
    }


#: Span kinds drawn as async slices in the Chrome format: they may overlap their siblings.
_ASYNC_KINDS = frozenset({"syscall", "io", "wait", "kv_move", CHILD})
#: Chrome "threads" (tracks): the control plane and sandbox, the worker session, children.
_TRACKS = {RUN: 1, CONTROL: 1, SANDBOX: 1, WORKER: 2, CHILD: 3}
_TRACK_NAMES = {1: "control plane", 2: "gpu worker", 3: "child runs"}


def chrome_trace(tree: dict[str, Any]) -> dict[str, Any]:
    """``tree`` in the Chrome trace-event format (what Perfetto and chrome://tracing open):
    microseconds since the run was created; spans that may overlap their siblings (calls,
    waits, children) as async slices, the rest as complete events."""
    events: list[dict[str, Any]] = [
        {"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": name}}
        for tid, name in _TRACK_NAMES.items()
    ]
    for span in tree["spans"]:
        ts = round(span["start_s"] * 1e6, 3)
        args = {**span["attrs"], "span_id": span["id"], "parent": span["parent"]}
        kind = span["kind"]
        if span["name"] == "end":
            events.append({"name": "end", "cat": kind, "ph": "i", "s": "t", "ts": ts, "pid": 1, "tid": 1, "args": args})
        elif kind in _ASYNC_KINDS:
            tid = _TRACKS.get(kind, 2)
            common = {"name": span["name"], "cat": kind, "id": span["id"], "pid": 1, "tid": tid}
            events.append({**common, "ph": "b", "ts": ts, "args": args})
            events.append({**common, "ph": "e", "ts": round(span["end_s"] * 1e6, 3)})
        else:
            dur = round((span["end_s"] - span["start_s"]) * 1e6, 3)
            tid = _TRACKS.get(kind, 1)
            events.append(
                {"name": span["name"], "cat": kind, "ph": "X", "ts": ts, "dur": dur, "pid": 1, "tid": tid, "args": args}
            )
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"run": tree["run"], "status": tree["status"]}}
