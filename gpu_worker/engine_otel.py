"""OpenTelemetry export of the engine's forwards, for operators (docs/ARCHITECTURE.md, "Traces").

Off unless ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set in the worker's environment: then every
forward is a span ``forward`` of the service ``symphony-worker`` (its batch size, prompt and
decode tokens, and how many sessions and accounts rode it), sent over OTLP/HTTP by the SDK's
batch processor. A forward serves several runs, each in a trace of its own, so it is not a
child of any: it carries one span link per run that rode it, to the run's span as the control
plane exports it (the context ``create_session`` brought, ``CreateSession.trace``). What is
sent: counts, times and the worker's name; never a tenant, an account or a run's tokens.

The engine thread only queues the forward's record (a bounded queue: past it records are
counted as dropped, never waited for); spans are built on a thread of this module. Off, the SDK
is never imported. The SDK's own settings apply (``OTEL_TRACES_SAMPLER``, ``OTEL_BSP_*``).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from typing import Any

from gpu_worker.engine_timeline import ForwardRecord

log = logging.getLogger(__name__)

#: The service the worker's spans are reported under, and their instrumentation scope.
SERVICE_NAME = "symphony-worker"
SCOPE = "symphony.engine"
#: Forward records waiting for the export thread at most (a few seconds of forwards).
QUEUE_BOUND = 10_000


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL of a collector's base URL, as the SDK appends it."""
    return endpoint + ("v1/traces" if endpoint.endswith("/") else "/v1/traces")


class EngineSpanExporter:
    """Turns forward records into spans on a thread of its own (``__call__`` only queues)."""

    def __init__(self, endpoint: str, worker: str) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        resource = Resource.create(
            {"service.name": SERVICE_NAME, "service.namespace": "symphony", "service.instance.id": worker}
        )
        self._provider = TracerProvider(resource=resource)
        self._provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=traces_url(endpoint))))
        self._tracer = self._provider.get_tracer(SCOPE)
        self.worker = worker
        self._queue: queue.Queue[ForwardRecord | None] = queue.Queue(maxsize=QUEUE_BOUND)
        self.dropped = 0
        self.exported = 0
        self._thread = threading.Thread(target=self._run, name="engine-otel", daemon=True)
        self._thread.start()

    def __call__(self, forward: ForwardRecord) -> None:
        try:
            self._queue.put_nowait(forward)
        except queue.Full:
            self.dropped += 1

    def _run(self) -> None:
        while True:
            forward = self._queue.get()
            if forward is None:
                return
            try:
                self._emit(forward)
            except Exception:
                log.exception("event=engine_span_failed")

    def _emit(self, forward: ForwardRecord) -> None:
        from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags

        links = [
            Link(SpanContext(t.trace_id, t.span_id, is_remote=True, trace_flags=TraceFlags(t.flags & 0xFF)))
            for t in forward.traces
        ]
        start = round(forward.start * 1e6) * 1000  # microseconds: a float's ns would be noise
        attributes: dict[str, Any] = {
            "symphony.worker": self.worker,
            "symphony.batch.size": forward.batch_size,
            "symphony.batch.prompt_tokens": forward.prompt_tokens,
            "symphony.batch.decode_tokens": forward.decode_tokens,
            "symphony.batch.tokens": forward.prompt_tokens + forward.decode_tokens,
            "symphony.batch.sessions": forward.sessions,
            "symphony.batch.accounts": len(forward.accounts),
        }
        span = self._tracer.start_span(
            "forward", kind=SpanKind.INTERNAL, start_time=start, links=links, attributes=attributes
        )
        span.end(end_time=start + round(forward.duration_s * 1e6) * 1000)
        self.exported += 1

    def stats(self) -> dict[str, int]:
        return {"exported": self.exported, "dropped": self.dropped, "queued": self._queue.qsize()}

    def shutdown(self, timeout: float = 10.0) -> None:
        """Send what is queued, then stop (the worker's shutdown)."""
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            pass
        self._thread.join(timeout)
        self._provider.shutdown()


def from_env(worker: str) -> EngineSpanExporter | None:
    """The exporter when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set, else None (nothing loaded)."""
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    if not endpoint:
        return None
    log.info("event=engine_otel_on endpoint=%s", traces_url(endpoint))
    return EngineSpanExporter(endpoint, worker)
