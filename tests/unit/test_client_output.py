"""The CLI's pieces that need no server: error messages that name the fields the API's
``detail`` lists, the human tables, and the elapsed-time line drawn on a real terminal (a pty)."""

from __future__ import annotations

import io
import os
import pty
import time

from symphony_client import ApiError
from symphony_client.client import Event
from symphony_client.follow import Notes, Progress, _stream
from symphony_client.output import table


def test_an_api_error_names_the_fields_its_detail_lists():
    detail = {"args": ["Expected a dictionary."], "limits": {"max_tokens": ["A valid integer is required."]}}
    error = ApiError(400, "invalid", "request failed", detail)
    assert str(error) == "400 invalid: args: Expected a dictionary.; limits.max_tokens: A valid integer is required."
    assert error.detail == detail and error.message == "request failed"
    assert (
        str(ApiError(401, "authentication_failed", "bad key", {"detail": "bad key"}))
        == "401 authentication_failed: bad key"
    )
    assert str(ApiError(409, "conflict", "run ended", None)) == "409 conflict: run ended"
    listed = ApiError(400, "invalid", "bad", {"items": [{"name": ["required"]}]})
    assert str(listed) == "400 invalid: bad (items.0.name: required)"


def test_tables_align_columns_and_shorten_timestamps():
    rows = [
        {"id": "a1", "status": "failed", "program_name": "echo", "program": 7, "version": 2,
         "created_at": "2026-11-25T17:53:06.123Z", "error": "x" * 100},
        {"id": "b", "status": "queued", "program_name": "echo", "program": 7, "version": 2, "created_at": None,
         "error": ""},
    ]  # fmt: skip
    lines = table(rows, "runs").splitlines()
    assert lines[0].split() == ["ID", "STATUS", "PROGRAM", "PROGRAM", "ID", "VERSION", "CREATED", "ERROR"]
    start = "a1  failed  echo     7           2        2026-11-25 17:53:06  xxx"
    assert lines[1].startswith(start) and lines[1].endswith("…"), lines[1]
    assert lines[2].split() == ["b", "queued", "echo", "7", "2", "-", "-"]
    assert table([], "runs") == "(none)"


def _drawn(progress: Progress, terminal: int, seconds: float) -> str:
    time.sleep(seconds)
    os.set_blocking(terminal, False)
    try:
        return os.read(terminal, 4096).decode()
    except BlockingIOError:
        return ""


def test_elapsed_time_is_drawn_on_a_terminal_only_between_lines_of_output():
    terminal, child = pty.openpty()
    err = os.fdopen(child, "w")
    try:
        with Progress(err, enabled=err.isatty(), quiet_s=0.1) as progress:
            progress.status = "running"
            assert "running 0s" in _drawn(progress, terminal, 0.6)
            # Half a line of tokens on stdout: leave it alone. Marked before the clear, as a slow
            # host may pass quiet_s between the two and the drawing thread would redraw the line.
            progress.at_line_start = False
            progress.clear()
            assert _drawn(progress, terminal, 0.2) == "\r\033[K"  # the clear, nothing drawn since
            assert _drawn(progress, terminal, 0.6) == ""
    finally:
        err.close()
        os.close(terminal)


class _Events:
    def __init__(self, events: list[Event]) -> None:
        self._events = events

    def events(self, run_id: str) -> list[Event]:
        return self._events


def test_channel_messages_a_run_sent_are_noted_on_stderr():
    out, err = io.StringIO(), io.StringIO()
    events = [
        Event("1-0", "token", {"text": "hi"}),
        Event("2-0", "channel", {"channel": "votes", "op": "send", "data": {"say": "ja"}, "bytes": 12}),
        Event("3-0", "channel", {"channel": "news", "op": "publish", "data": [1], "bytes": 3}),
        Event("4-0", "end", {"status": "succeeded"}),
    ]
    with Progress(err, enabled=False) as progress:
        notes = Notes(err, progress, shared=False)
        ended = _stream(_Events(events), "r1", False, out, notes, progress)  # type: ignore[arg-type]
    assert ended == {"status": "succeeded"}
    assert out.getvalue() == "hi"  # the notes add no newline to the answer
    assert err.getvalue() == 'sent on channel votes: {"say": "ja"}\npublished on channel news: [1]\n'
