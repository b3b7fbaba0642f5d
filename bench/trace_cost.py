"""What per-run tracing costs the worker, measured directly rather than read off an A/B of two
noisy runs: the CPU time of one ``pred``'s trace span (:func:`trace_call_cost_us`), and that
cost over a run's ``pred`` calls as a share of its wall time (:func:`span_share`). B3 sets it
against a decode step, B11 against a whole chat workload (bench/README.md, "B3" and "B11")."""

from __future__ import annotations

import time


def trace_call_cost_us(n: int = 20_000) -> dict[str, float]:
    """Microseconds the worker spends per ``pred`` on its trace span (``ops.pred.trace_call``:
    a clock read, the span's values, the append or the bucket's additions), timed in-process
    with a real ``SessionTrace``: while spans are kept one by one (the first ``MAX_SPANS``),
    past them (per-second buckets), and with tracing off. CPU time of this thread, not wall
    time: on a shared host the wall clock also counts the time the thread waited for a core.
    Set against a round trip in ms this is the share of it tracing costs."""
    from types import SimpleNamespace

    from gpu_worker.ops.pred import trace_call
    from gpu_worker.scheduler import PredCall
    from gpu_worker.tracing import MAX_SPANS, SessionTrace

    def timed(trace: SessionTrace, calls: int) -> float:
        session = SimpleNamespace(trace=trace)
        call = PredCall(session, 1, (5,), (0,))  # type: ignore[arg-type]
        call.started, call.forwards, call.forward_s, call.forward_share_s = call.enqueued, 1, 0.001, 0.0005
        call.batch_size, call.batch_tokens, call.own_tokens, call.chosen = 8, 8, 1, [7]
        t0 = time.thread_time()
        for _ in range(calls):
            trace_call(session, call)  # type: ignore[arg-type]
        return 1e6 * (time.thread_time() - t0) / calls

    kept = min(timed(SessionTrace(), MAX_SPANS) for _ in range(20))
    full = SessionTrace()
    timed(full, MAX_SPANS)
    return {
        "spans_kept_us": round(kept, 3),
        "bucketed_us": round(timed(full, n), 3),
        "off_us": round(timed(SessionTrace(enabled=False), n), 3),
    }


def span_share(pred_calls: int, per_call_us: float, wall_s: float) -> float:
    """The share of ``wall_s`` the worker spent on the spans of ``pred_calls`` calls: the
    worker records spans on its event loop, one call after another, so their CPU time is at
    most this share of what a run of that wall time could lose to them."""
    return pred_calls * per_call_us / (wall_s * 1e6) if wall_s > 0 else 0.0
