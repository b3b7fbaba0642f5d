"""A client's W3C ``traceparent`` header, validated strictly (docs/ARCHITECTURE.md, "Traces").

Kept with the run it came with (``Run.traceparent``) so the run's exported span is a child of
the client's span (api/services/otel_export.py). A header that is not exactly a version-00
``traceparent`` (https://www.w3.org/TR/trace-context/#traceparent-header) is ignored: tracing
is the operator's aid, never a reason to refuse a request.

A run's own span has ids known before it is exported (:func:`run_context`): the worker is
told them at ``create_session`` and its engine spans link to that span, which the control
plane's export later creates with the same ids (api/services/otel_export.py).
"""

from __future__ import annotations

import hashlib
import re
import uuid
from dataclasses import dataclass

from gpu_worker.protocol import TraceContext

#: ``00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>``, lower-case only (the spec's form).
_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
#: The header's length (what ``Run.traceparent`` holds at most).
TRACEPARENT_CHARS = 55


@dataclass(frozen=True)
class ParentContext:
    """The client's span: its trace, its own id and its flags (bit 0: sampled)."""

    trace_id: int
    span_id: int
    flags: int


def parse(header: str | None) -> ParentContext | None:
    """The client's span of a ``traceparent`` header; None when absent or malformed (an all-zero
    trace or parent id is invalid by the spec)."""
    if not header:
        return None
    match = _TRACEPARENT.fullmatch(header.strip())
    if match is None:
        return None
    trace_id, span_id = int(match[1], 16), int(match[2], 16)
    if trace_id == 0 or span_id == 0:
        return None
    return ParentContext(trace_id, span_id, int(match[3], 16))


def kept(header: str | None) -> str:
    """What a run keeps of a request's header: the header itself when valid, else ""."""
    context = parse(header)
    if context is None:
        return ""
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.flags:02x}"


def run_span_id(run_id: uuid.UUID) -> int:
    """The span id of the run's exported span: derived from its id (never zero), so the worker
    can link to the span long before the control plane exports it."""
    return int.from_bytes(hashlib.blake2b(run_id.bytes, digest_size=8, person=b"symphony-run").digest()) or 1


def run_context(run_id: uuid.UUID, traceparent: str | None) -> TraceContext:
    """The trace context of a run's span: the client's trace (its sampled flag too) when the run
    came with a valid ``traceparent``, else a trace of the run's own, whose id is the run's."""
    client = parse(traceparent)
    if client is None:
        return TraceContext(run_id.int or 1, run_span_id(run_id), 1)
    return TraceContext(client.trace_id, run_span_id(run_id), client.flags)
