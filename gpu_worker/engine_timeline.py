"""The engine's timeline: the last forwards this worker ran, for staff (docs/ARCHITECTURE.md,
"Traces").

A run's trace says how its own calls fared; when a run was slow because the engine was busy,
the question is what else the engine was doing. The scheduler records each forward here
(:meth:`EngineTimeline.record`, on the engine thread): when it started, how long it took, its
batch size, its prompt and decode tokens, how many sessions rode it and each account's tokens.
The control plane reads the ring over the admin socket (``engine_timeline``) for
``GET /staff/workers/<name>/timeline``; it is never shown to a tenant (it names accounts).

Bounded: a ring of ``protocol.MAX_TIMELINE_FORWARDS`` forwards (older ones are dropped), each a
tuple holding at most one pair per sequence of the batch. A forward also carries the trace
contexts of the runs that rode it, for the OTLP exporter (gpu_worker/engine_otel.py), which a
``sink`` hands them to; the ring itself never serves them.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

from gpu_worker import protocol
from gpu_worker.protocol import TraceContext

#: Distinct account names one reply names at most (older forwards are left out past it): keeps
#: the reply under the protocol's list bound whatever the accounts.
MAX_REPLY_ACCOUNTS = 4096


class ForwardRecord(NamedTuple):
    """One forward, as the ring keeps it."""

    #: Wall clock (``time.time()``) when the forward started, and its length in seconds.
    start: float
    duration_s: float
    #: Sequences in the forward (calls, each one chunk).
    batch_size: int
    prompt_tokens: int
    decode_tokens: int
    #: Sessions (runs) that had a call in it.
    sessions: int
    #: (account, tokens) per account that had a call in it.
    accounts: tuple[tuple[str, int], ...]
    #: The trace contexts of the runs in it that have one (for the OTLP export only).
    traces: tuple[TraceContext, ...] = ()


class EngineTimeline:
    """A bounded ring of :class:`ForwardRecord`. Written by the engine thread, read from the
    event loop (the lock makes a read see whole records); ``sink`` is told each record too."""

    def __init__(
        self, capacity: int = protocol.MAX_TIMELINE_FORWARDS, sink: Callable[[ForwardRecord], None] | None = None
    ) -> None:
        self.capacity = capacity
        self._ring: collections.deque[ForwardRecord] = collections.deque(maxlen=capacity)
        self._lock = threading.Lock()
        self.recorded = 0
        self.sink = sink

    def __len__(self) -> int:
        return len(self._ring)

    def record(self, forward: ForwardRecord) -> None:
        with self._lock:
            self._ring.append(forward)
            self.recorded += 1
        if self.sink is not None:
            self.sink(forward)

    def snapshot(self, limit: int | None = None) -> protocol.EngineTimelineReply:
        """The newest ``limit`` forwards (default: all kept), oldest first, as the admin op's
        reply; accounts by index into one table."""
        with self._lock:
            kept = list(self._ring)
            recorded = self.recorded
        if limit is not None:
            kept = kept[-limit:] if limit > 0 else []
        index: dict[str, int] = {}
        rows: list[list[Any]] = []
        for f in reversed(kept):  # newest first: past the account bound the oldest are left out
            new = {a for a, _ in f.accounts if a not in index}
            if len(index) + len(new) > MAX_REPLY_ACCOUNTS:
                break
            pairs: list[int] = []
            for account, tokens in f.accounts:
                pairs += [index.setdefault(account, len(index)), tokens]
            rows.append(
                [
                    round(f.start, 6),
                    round(f.duration_s, 6),
                    f.batch_size,
                    f.prompt_tokens,
                    f.decode_tokens,
                    f.sessions,
                    pairs,
                ]
            )
        rows.reverse()
        return protocol.EngineTimelineReply(
            capacity=self.capacity, recorded=recorded, accounts=list(index), forwards=rows
        )


def expand(reply: dict[str, Any]) -> list[dict[str, Any]]:
    """An ``engine_timeline`` reply's rows as maps (what the control plane serves)."""
    accounts = reply.get("accounts") or []
    out = []
    for start, duration, batch, prompt, decode, sessions, pairs in reply.get("forwards") or []:
        out.append(
            {
                "start": start,
                "duration_s": duration,
                "batch_size": batch,
                "prompt_tokens": prompt,
                "decode_tokens": decode,
                "sessions": sessions,
                "accounts": len(pairs) // 2,
                "tokens_per_account": {accounts[pairs[i]]: pairs[i + 1] for i in range(0, len(pairs), 2)},
            }
        )
    return out
