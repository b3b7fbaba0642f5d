"""Per-session trace: where a run's time went on this worker, bounded whatever the run does.

A session records one span per system call (``pred`` with its queue wait and its share of the
forwards it rode in: batch size, tokens in the batch), per brokered I/O wait (``sleep``,
``http_fetch``), per channel or child wait, and per KV move between tiers (bytes). The trace
goes back to the control plane in ``end_session``'s reply (``SessionEnded.trace``), the way the
session's usage does, and is stored with the run (docs/ARCHITECTURE.md, "Traces").

Bounded: the first ``MAX_SPANS`` spans are kept one by one; after that a span only adds to the
bucket of its kind, name and second since the session started (count, summed durations, queue
waits and tokens), and past ``MAX_BUCKETS`` buckets it is only counted (``dropped``). A per-token
``pred`` therefore costs a tuple while under the bound and a few float additions after it.

The session keeps the run's W3C trace context (``context``), which the control plane sends with
``create_session``: the engine's forwards the session rode carry it (gpu_worker/
engine_timeline.py), so the worker's exported ``forward`` spans link to the run's span.

What a span says of the calls it rode with is counts (batch size, batch tokens), never which
sessions or tenants those were: a trace is shown to the run's tenant.

Times are ``time.monotonic()`` readings; :meth:`SessionTrace.to_wire` turns them into seconds
since the session's creation and gives the wall clock of that moment (``started_at``), so the
control plane places them next to its own spans.

Off switch: a worker started with ``--trace off`` (``SYMPHONY_WORKER_TRACE=off``) gives its
sessions a trace with ``enabled=False``. Callers on the per-call path test ``enabled`` before
they gather a span's values, so an untraced call costs one attribute read; :meth:`add` ignores
what still reaches it, and the wire trace says ``enabled: false`` (no spans), which the
control plane shows as "tracing was off on this worker" next to its own marks.
"""

from __future__ import annotations

import threading
import time
from typing import Any, TypedDict

from gpu_worker.protocol import TraceContext

#: Spans kept one by one per session (then per-second buckets).
MAX_SPANS = 200
#: Per-second buckets kept per session once ``MAX_SPANS`` is reached (a run at its deadline of
#: an hour with one kind of call fills 3600; past the bound spans are only counted).
MAX_BUCKETS = 2000

#: Span kinds: what the session was doing.
SYSCALL = "syscall"
IO = "io"
WAIT = "wait"
KV_MOVE = "kv_move"

#: Ops whose time is a brokered I/O wait, and ops whose time is waiting on another run.
IO_OPS = frozenset({"sleep", "http_fetch"})
WAIT_OPS = frozenset({"channel_recv", "channel_next", "child_wait"})


class WireSpan(TypedDict):
    """One span as it travels: seconds since the session started."""

    kind: str
    name: str
    start_s: float
    end_s: float
    attrs: dict[str, Any]


class WireBucket(TypedDict):
    """The spans of one kind and name that began in one second past the bound."""

    kind: str
    name: str
    second: int
    count: int
    duration_s: float
    queue_wait_s: float
    tokens: int
    end_s: float


class WireTrace(TypedDict):
    """``SessionEnded.trace``: the session's spans, buckets and how many were dropped."""

    started_at: float
    duration_s: float
    spans: list[WireSpan]
    buckets: list[WireBucket]
    dropped: int
    #: False: the worker ran with tracing off and recorded no spans (only the session's bounds).
    enabled: bool


def _rounded(attrs: dict[str, Any]) -> dict[str, Any]:
    """A span's attributes as they travel: seconds to the microsecond (rounded here, at the
    session's end, rather than on the per-call path)."""
    return {k: round(v, 6) if isinstance(v, float) else v for k, v in attrs.items()}


def op_kind(op: str) -> str:
    """The kind of span a non-``pred`` op's time is."""
    if op in IO_OPS:
        return IO
    if op in WAIT_OPS:
        return WAIT
    return SYSCALL


class SessionTrace:
    """The spans of one session. Written from the event loop (ops) and the engine thread (KV
    moves back to the device), hence the lock; it is never contended on the per-token path long
    enough to matter (a list append or a few additions)."""

    __slots__ = ("_buckets", "_lock", "_spans", "_swapped_bytes", "context", "dropped", "enabled", "t0", "wall0")

    def __init__(self, enabled: bool = True, context: TraceContext | None = None) -> None:
        #: Spans are recorded; per-call callers test it before building a span's values.
        self.enabled = enabled
        #: The run's W3C trace context (``CreateSession.trace``): the forwards the session rides
        #: link to it when the worker exports its engine spans (gpu_worker/engine_otel.py).
        self.context = context
        self.t0 = time.monotonic()
        self.wall0 = time.time()
        self._spans: list[tuple[str, str, float, float, dict[str, Any]]] = []
        #: (kind, name, second) -> [count, duration, queue wait, tokens, last end]
        self._buckets: dict[tuple[str, str, int], list[float]] = {}
        self.dropped = 0
        self._swapped_bytes = 0
        self._lock = threading.Lock()

    def add(
        self, kind: str, name: str, start: float, end: float, queue_wait: float = 0.0, tokens: int = 0, **attrs: Any
    ) -> None:
        """One span from ``start`` to ``end`` (monotonic). ``queue_wait`` and ``tokens`` are kept
        in buckets too; other ``attrs`` only while spans are kept one by one."""
        if not self.enabled:
            return
        with self._lock:
            if len(self._spans) < MAX_SPANS:
                if queue_wait:
                    attrs["queue_wait_s"] = queue_wait  # rounded by ``to_wire``, once
                if tokens:
                    attrs["tokens"] = tokens
                self._spans.append((kind, name, start, end, attrs))
                return
            key = (kind, name, int(start - self.t0))
            bucket = self._buckets.get(key)
            if bucket is None:
                if len(self._buckets) >= MAX_BUCKETS:
                    self.dropped += 1
                    return
                bucket = self._buckets[key] = [0, 0.0, 0.0, 0, end]
            bucket[0] += 1
            bucket[1] += end - start
            bucket[2] += queue_wait
            bucket[3] += tokens
            bucket[4] = max(bucket[4], end)

    @property
    def keeps_spans(self) -> bool:
        """Spans are still kept one by one: a caller gathers a span's attributes only then
        (past the bound they would be thrown away)."""
        return self.enabled and len(self._spans) < MAX_SPANS

    def kv_out(self, start: float, end: float, nbytes: int, src: str = "device", dst: str = "host") -> None:
        """The session's KV left ``src`` for ``dst`` (a swap while it waits on I/O)."""
        if not self.enabled:
            return
        self._swapped_bytes += nbytes
        self.add(KV_MOVE, f"{src}->{dst}", start, end, bytes=nbytes)

    def kv_back(self, start: float, end: float, src: str = "host", dst: str = "device") -> None:
        """What :meth:`kv_out` moved came back (its bytes, as they left)."""
        if not self.enabled:
            return
        nbytes, self._swapped_bytes = self._swapped_bytes, 0
        self.add(KV_MOVE, f"{src}->{dst}", start, end, bytes=nbytes)

    def to_wire(self, now: float | None = None) -> WireTrace:
        now = time.monotonic() if now is None else now
        t0 = self.t0
        with self._lock:
            spans: list[WireSpan] = [
                {"kind": k, "name": n, "start_s": round(s - t0, 6), "end_s": round(e - t0, 6), "attrs": _rounded(a)}
                for k, n, s, e, a in self._spans
            ]
            buckets: list[WireBucket] = [
                {
                    "kind": k,
                    "name": n,
                    "second": sec,
                    "count": int(b[0]),
                    "duration_s": round(b[1], 6),
                    "queue_wait_s": round(b[2], 6),
                    "tokens": int(b[3]),
                    "end_s": round(b[4] - t0, 6),
                }
                for (k, n, sec), b in self._buckets.items()
            ]
            dropped = self.dropped
        return {
            "started_at": self.wall0,
            "duration_s": round(now - t0, 6),
            "spans": spans,
            "buckets": buckets,
            "dropped": dropped,
            "enabled": self.enabled,
        }
