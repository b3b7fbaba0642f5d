"""The W3C ``traceparent`` a run keeps (api/services/trace_context.py): only the spec's exact
version-00 form; anything else is dropped, never an error."""

from __future__ import annotations

import pytest

from api.services import trace_context

VALID = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_valid_header_is_kept_with_its_ids_and_flags():
    context = trace_context.parse(VALID)
    assert context == trace_context.ParentContext(0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, 1)
    assert trace_context.kept(VALID) == VALID
    assert trace_context.kept(f"  {VALID} ") == VALID
    assert len(VALID) == trace_context.TRACEPARENT_CHARS


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "garbage",
        VALID.upper(),  # upper-case hex
        "01" + VALID[2:],  # another version
        "ff" + VALID[2:],
        VALID + "-extra",
        VALID[:-1],
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # all-zero trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # all-zero parent id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
        "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
        "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
    ],
)
def test_a_malformed_header_is_dropped(header):
    assert trace_context.parse(header) is None
    assert trace_context.kept(header) == ""


def test_a_runs_span_ids_are_known_before_it_is_exported():
    """What the worker is told at ``create_session`` (its engine spans link to it): the client's
    trace and flags, or the run's own trace; a span id fixed by the run's id alone."""
    import uuid

    run = uuid.uuid4()
    traced = trace_context.run_context(run, VALID)
    assert traced.trace_id == 0x4BF92F3577B34DA6A3CE929D0E0E4736 and traced.flags == 1
    assert traced.span_id == trace_context.run_span_id(run) != 0x00F067AA0BA902B7
    assert traced.header() == f"00-4bf92f3577b34da6a3ce929d0e0e4736-{traced.span_id:016x}-01"
    untraced = trace_context.run_context(run, "garbage")
    assert untraced.trace_id == run.int and untraced.span_id == traced.span_id and untraced.flags == 1
    assert trace_context.run_context(uuid.uuid4(), None).span_id != traced.span_id
