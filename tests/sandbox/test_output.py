"""Output capture: the byte cap, and the runner's result record kept apart from program output."""

from __future__ import annotations

import json

from sandbox.output import RESULT_MARKER, OutputCollector
from symphony.run import RESULT_MARKER as RUNNER_MARKER


def record(obj) -> bytes:
    return b"\n" + RESULT_MARKER + json.dumps(obj).encode() + b"\n"


def test_marker_and_exit_statuses_are_the_runners() -> None:
    from sandbox import cold
    from symphony import run

    assert RUNNER_MARKER.encode() == RESULT_MARKER
    assert (cold.RUNNER_EXIT_OK, cold.RUNNER_EXIT_PROGRAM_FAILED, cold.RUNNER_EXIT_SETUP_FAILED) == (
        run.EXIT_OK,
        run.EXIT_PROGRAM_FAILED,
        run.EXIT_SETUP_FAILED,
    )


def test_a_complete_record_line_is_signalled() -> None:
    """The cold launcher ends a run at the record: only a whole line may signal it."""
    c = OutputCollector(limit_bytes=100)
    line = record({"ok": True, "result": 1})
    c.feed_stdout(line[:-5])
    assert not c.record_seen.is_set()
    c.feed_stdout(line[-5:])
    assert c.record_seen.is_set() and c.result().record == {"ok": True, "result": 1}


def test_record_is_separated_from_output_and_not_counted() -> None:
    c = OutputCollector(limit_bytes=10)
    c.feed_stdout(b"hello\n")
    c.feed_stdout(record({"ok": True, "result": "x" * 1000}))
    got = c.result()
    assert got.stdout == "hello\n"
    assert got.record == {"ok": True, "result": "x" * 1000}
    assert not got.exceeded


def test_record_split_across_chunks_and_interleaved_stderr() -> None:
    c = OutputCollector(limit_bytes=100)
    data = b"out" + record({"ok": False, "error": "boom"})
    for i in range(len(data)):
        c.feed_stdout(data[i : i + 1])
        c.feed_stderr(b"")
    c.feed_stderr(b"warning\n")
    got = c.result()
    assert got.record == {"ok": False, "error": "boom"}
    assert got.stdout == "out"
    assert got.stderr == "warning\n"


def test_cap_keeps_the_head_and_flags_the_flood() -> None:
    c = OutputCollector(limit_bytes=1000)
    for _ in range(100):
        c.feed_stdout(b"y" * 4096)
    got = c.result()
    assert got.exceeded
    assert len(got.stdout) == 1000
    assert got.total_bytes == 409600


def test_a_line_without_newline_cannot_hide_a_flood() -> None:
    c = OutputCollector(limit_bytes=100)
    c.feed_stdout(RESULT_MARKER[:5])  # looks like a marker start, then is not
    c.feed_stdout(b"z" * 500)
    assert c.result().exceeded


def test_a_fake_oversized_record_counts_as_output() -> None:
    c = OutputCollector(limit_bytes=1000)
    c.feed_stdout(RESULT_MARKER + b"a" * (5 * 1024 * 1024))
    assert c.result().exceeded
