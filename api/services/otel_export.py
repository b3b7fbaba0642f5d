"""OpenTelemetry export of finished runs' traces, for operators (docs/ARCHITECTURE.md, "Traces").

Off unless ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set: then, after a run's end is committed
(``finish_run``), its span tree (:func:`api.services.run_traces.trace_tree`, the one
``GET /runs/<id>/trace`` serves, worker spans included) is handed to the OpenTelemetry SDK,
whose ``BatchSpanProcessor`` sends it from its own thread with the OTLP/HTTP (protobuf)
exporter. Off, this module loads nothing: the SDK is imported, and its provider and thread made,
on the first export of a process that has the setting.

A run created with a valid client ``traceparent`` (``Run.traceparent``) is exported as a child
of the client's span, in the client's trace; else its span starts a trace whose id is the
run's. The run's span id is derived from the run's id (``trace_context.run_context``): the
worker, told it at ``create_session``, links its engine spans to it. What is sent: ids, the
tenant's slug, statuses, the worker's name, times and the spans' numeric and name attributes;
never a program's arguments, output, result or error text.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from typing import TYPE_CHECKING, Any

from django.conf import settings

from api.models import Run
from api.services import run_traces, trace_context

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Tracer

log = logging.getLogger(__name__)

#: The instrumentation scope the spans are reported under.
SCOPE = "symphony.runs"
#: Tree attributes with a namespaced name of their own; the rest are ``symphony.<name>``.
_ATTRIBUTE_NAMES = {"run": "symphony.run.id", "status": "symphony.run.status", "worker": "symphony.worker"}

_lock = threading.Lock()
_provider: TracerProvider | None = None
_provider_pid: int | None = None
#: The ids the next span started on this thread takes (the run's span: ``_RunIds``).
_fixed = threading.local()


def enabled() -> bool:
    """Whether this process exports runs (the setting is read, nothing else is done)."""
    return bool(settings.OTEL_EXPORTER_OTLP_ENDPOINT)


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL of a collector's base URL, as the SDK appends it."""
    return endpoint + ("v1/traces" if endpoint.endswith("/") else "/v1/traces")


def _tracer() -> Tracer:
    """The process's tracer, its provider made on first use (again in a forked child: a
    provider's batch thread does not survive a fork)."""
    global _provider, _provider_pid
    with _lock:
        if _provider is None or _provider_pid != os.getpid():
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor

            resource = Resource.create(
                {
                    "service.name": os.environ.get("OTEL_SERVICE_NAME") or "symphony-control-plane",
                    "service.namespace": "symphony",
                    "service.instance.id": f"{socket.gethostname()}:{os.getpid()}",
                }
            )
            provider = TracerProvider(resource=resource, id_generator=_run_ids())
            exporter = OTLPSpanExporter(endpoint=traces_url(settings.OTEL_EXPORTER_OTLP_ENDPOINT))
            provider.add_span_processor(BatchSpanProcessor(exporter))
            _provider, _provider_pid = provider, os.getpid()
        return _provider.get_tracer(SCOPE)


def _run_ids() -> Any:
    """The SDK's random ids, except for a run's span: it takes the ids the worker was told at
    ``create_session`` (``trace_context.run_context``), so the worker's ``forward`` spans link
    to it (gpu_worker/engine_otel.py)."""
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class RunIds(RandomIdGenerator):
        def generate_span_id(self) -> int:
            fixed = getattr(_fixed, "span_id", None)
            return fixed if fixed else super().generate_span_id()

        def generate_trace_id(self) -> int:
            fixed = getattr(_fixed, "trace_id", None)
            return fixed if fixed else super().generate_trace_id()

        def is_trace_id_random(self) -> bool:
            return False  # a run's own trace id is its id, not a random W3C level-2 id

    return RunIds()


def _attributes(attrs: dict[str, Any]) -> dict[str, Any]:
    return {_ATTRIBUTE_NAMES.get(key, f"symphony.{key}"): value for key, value in attrs.items()}


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


def export(run: Run) -> None:
    """Hand the finished run's span tree to the SDK's batch processor (sent from its thread).
    Never raises: a failure to build or queue the spans is logged, and the run is unaffected."""
    if not enabled():
        return
    try:
        _export(run)
    except Exception:
        log.exception("otel_export_failed run=%s", run.pk)


def _parent_context(run: Run) -> Any:
    """The client's span as the run span's parent (None: the run span starts a trace)."""
    client = trace_context.parse(run.traceparent)
    if client is None:
        return None
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    remote = SpanContext(client.trace_id, client.span_id, is_remote=True, trace_flags=TraceFlags(client.flags))
    return trace.set_span_in_context(NonRecordingSpan(remote))


def _export(run: Run) -> None:
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind, Status, StatusCode

    tree = run_traces.trace_tree(run)
    base = run.created_at.timestamp()
    tracer = _tracer()
    spans: dict[int, Any] = {}
    ends: list[tuple[Any, int]] = []
    root_attrs = {
        "symphony.run.id": str(run.pk),
        "symphony.tenant": run.tenant.slug,
        "symphony.run.depth": run.depth,
        "symphony.trace.complete": tree["complete"],
        "symphony.trace.dropped": tree["dropped"],
    }
    if run.parent_id:
        root_attrs["symphony.run.parent"] = str(run.parent_id)
    for node in tree["spans"]:
        start = _ns(base + node["start_s"])
        attrs = _attributes(node["attrs"]) | {"symphony.span.kind": node["kind"]}
        if node["parent"] is None:
            context, kind = _parent_context(run), SpanKind.SERVER
            ids = trace_context.run_context(run.pk, run.traceparent)
            _fixed.trace_id, _fixed.span_id = ids.trace_id, ids.span_id
            try:
                span = tracer.start_span(
                    "run", context=context, kind=kind, start_time=start, attributes=root_attrs | attrs
                )
            finally:
                _fixed.trace_id = _fixed.span_id = None
            if run.status != "succeeded":
                span.set_status(Status(StatusCode.ERROR, run.status))
        elif node["name"] == "end" and node["kind"] == run_traces.CONTROL:
            spans[node["parent"]].add_event("end", attributes=attrs, timestamp=start)
            continue
        else:
            if attrs.get("symphony.aggregated"):
                attrs["symphony.busy_s"] = node["duration_s"]
            parent = trace.set_span_in_context(spans[node["parent"]])
            span = tracer.start_span(node["name"], context=parent, start_time=start, attributes=attrs)
        spans[node["id"]] = span
        ends.append((span, _ns(base + node["end_s"])))
    # Children first, the run's span last: a batch then holds a run's whole tree when it can.
    for span, end in reversed(ends):
        span.end(end_time=end)
