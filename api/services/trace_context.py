"""A client's W3C ``traceparent`` header, validated strictly (docs/ARCHITECTURE.md, "Traces").

Kept with the run it came with (``Run.traceparent``) so the run's exported span is a child of
the client's span (api/services/otel_export.py). A header that is not exactly a version-00
``traceparent`` (https://www.w3.org/TR/trace-context/#traceparent-header) is ignored: tracing
is the operator's aid, never a reason to refuse a request.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

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
