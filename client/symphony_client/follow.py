"""``symphony run --follow`` / ``symphony follow RUN``: stream a run until it ends and turn its
final status into the exit code.

Human mode writes what the program produced to stdout and nothing else: its tokens byte for
byte, its other ``send_to_user`` messages on lines of their own, and at the end one newline if
the text did not end with one. Everything about the run (status changes, ``kv:`` lines with
``--verbose``, elapsed time while nothing streams, the closing line) goes to stderr, so
``symphony follow RUN > answer.txt`` keeps only the answer. When stdout and stderr are the same
file (a terminal, or ``> log 2>&1``), a line about the run that arrives in the middle of a line
of the answer waits until that line ends (or the run does), so it never cuts the answer. JSON
mode writes JSON Lines to stdout, one object per event. Ctrl-C never leaves a traceback: from a
terminal it asks whether to cancel the run; otherwise (or on "no") it says how to re-attach and
exits 130. A run cancelled on request ends with ``Cancelled by you at <time>``, not with what the
stopped program reported (``--verbose`` adds that).
"""

from __future__ import annotations

import io
import json
import os
import threading
import time
from datetime import datetime
from typing import TextIO

from symphony_client.client import ApiError, Client, StreamLost
from symphony_client.output import plural
from symphony_client.types import TERMINAL_STATUSES, Run

#: Exit codes (documented in client/README.md).
EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_CANCELLED, EXIT_TIMED_OUT, EXIT_INTERRUPTED = 0, 1, 2, 3, 4, 130
EXIT_BY_STATUS = {"succeeded": EXIT_OK, "failed": EXIT_ERROR, "cancelled": EXIT_CANCELLED, "timed_out": EXIT_TIMED_OUT}
SPINNER = "|/-\\"


def same_file(a: TextIO, b: TextIO) -> bool:
    """Whether two streams write to one file (one terminal, or ``> log 2>&1``): then a line on
    one lands in the middle of a line of the other."""
    try:
        return os.path.samestat(os.fstat(a.fileno()), os.fstat(b.fileno()))
    except (OSError, ValueError, io.UnsupportedOperation):
        return False


class Progress:
    """A ``running 12s`` line on a terminal's stderr, redrawn while no output streams. When
    stdout is that same terminal it is drawn only while stdout's text ends a line, so it never
    overwrites half a line of tokens."""

    def __init__(self, err: TextIO, enabled: bool, quiet_s: float = 1.0, shared: bool = True) -> None:
        self._err, self._enabled, self._quiet_s, self._shared = err, enabled, quiet_s, shared
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._started = self._last = time.monotonic()
        self._shown = False
        self.at_line_start = True
        self.status = "waiting"
        self._thread = threading.Thread(target=self._draw, daemon=True) if enabled else None

    def __enter__(self) -> Progress:
        if self._thread:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=1)
        self.clear()

    def elapsed(self) -> float:
        return time.monotonic() - self._started

    def clear(self) -> None:
        """Wipe the line before anything else is written; marks activity."""
        with self._lock:
            if self._shown:
                self._err.write("\r\033[K")
                self._err.flush()
                self._shown = False
            self._last = time.monotonic()

    def _draw(self) -> None:
        turn = 0
        while not self._stop.wait(0.2):
            with self._lock:
                if (self._shared and not self.at_line_start) or time.monotonic() - self._last < self._quiet_s:
                    continue
                turn += 1
                self._err.write(f"\r\033[K{SPINNER[turn % 4]} {self.status} {self.elapsed():.0f}s")
                self._err.flush()
                self._shown = True


class Notes:
    """Lines about the run, on stderr. When stderr is stdout's file, a line that arrives while
    the answer is in the middle of a line is held until that line ends: the answer stays whole
    and stdout gets no newline it did not stream. Of held ``kv`` lines only the latest is kept
    (each is a snapshot)."""

    def __init__(self, err: TextIO, progress: Progress, shared: bool) -> None:
        self._err, self._progress, self._shared = err, progress, shared
        self._held: list[tuple[str, str]] = []

    def add(self, text: str, kind: str = "") -> None:
        if self._shared and not self._progress.at_line_start:
            if kind:
                self._held = [(k, t) for k, t in self._held if k != kind]
            self._held.append((kind, text))
            return
        self._err.write(text + "\n")
        self._err.flush()

    def release(self) -> None:
        """Write the held lines: the answer's line has ended."""
        held, self._held = self._held, []
        for _, text in held:
            self._err.write(text + "\n")
        self._err.flush()


def follow(
    client: Client, run_id: str, as_json: bool, out: TextIO, err: TextIO, stdin: TextIO, verbose: bool = False
) -> int:
    """Stream the run's events until ``end``; returns the exit code of its final status."""
    shared = same_file(out, err)
    progress = Progress(err, enabled=not as_json and err.isatty(), shared=shared)
    notes = Notes(err, progress, shared)
    try:
        with progress:
            ended = _stream(client, run_id, as_json, out, notes, progress, verbose)
            run = client.get_run(run_id)
    except KeyboardInterrupt:
        _end_answer(out, notes, progress)
        return _interrupted(client, run_id, err, stdin)
    except StreamLost as exc:
        _end_answer(out, notes, progress)
        err.write(f"error: {exc.message}\nthe run may still be going; re-attach: symphony follow {run_id}\n")
        return EXIT_ERROR
    status = run["status"] if run["status"] in TERMINAL_STATUSES else ended.get("status", run["status"])
    if as_json:
        out.write(json.dumps({"event": "run", "data": run}) + "\n")
    else:
        _end_answer(out, notes, progress)
        err.write(_closing_line(run, status, progress.elapsed(), verbose) + "\n")
    out.flush()
    err.flush()
    return EXIT_BY_STATUS.get(status, EXIT_ERROR)


def _end_answer(out: TextIO, notes: Notes, progress: Progress) -> None:
    """The answer's one closing newline (when its text did not end a line), then the held notes."""
    if not progress.at_line_start:
        out.write("\n")
        out.flush()
        progress.at_line_start = True
    notes.release()


def _stream(
    client: Client, run_id: str, as_json: bool, out: TextIO, notes: Notes, progress: Progress, verbose: bool = False
) -> dict:
    """Write each event; returns the ``end`` event's data."""
    for event in client.events(run_id):
        progress.clear()
        data = event.data if isinstance(event.data, dict) else {"value": event.data}
        if as_json:
            out.write(json.dumps({"event": event.type, "id": event.id, "data": event.data}) + "\n")
            out.flush()
        elif event.type == "token":
            _answer(str(data.get("text", "")), out, notes, progress)
        elif event.type == "message":
            message = data.get("data")
            prefix = "" if progress.at_line_start else "\n"
            out.write(prefix + (message if isinstance(message, str) else json.dumps(message)) + "\n")
            out.flush()
            progress.at_line_start = True
            notes.release()
        elif event.type == "status":
            progress.status = str(data.get("status", "?"))
            if progress.status not in TERMINAL_STATUSES:  # the closing line says the final one
                why = f" ({data['reason']})" if data.get("reason") else ""
                notes.add(f"run {run_id}: {progress.status}{why}")
        elif event.type == "kv" and verbose:
            notes.add(kv_line(data), kind="kv")
        elif event.type == "channel":  # a message the run sent to a run of its tree
            verb = "published on" if data.get("op") == "publish" else "sent on"
            notes.add(f"{verb} channel {data.get('channel')}: {json.dumps(data.get('data'))}")
        if event.type == "end":
            return data
    return {}


def _answer(text: str, out: TextIO, notes: Notes, progress: Progress) -> None:
    """Tokens to stdout as they came; held notes go out where a line of them ends (the text is
    written in two parts there, byte for byte the same)."""
    cut = text.rfind("\n") + 1
    for part in (text[:cut], text[cut:]):
        if not part:
            continue
        out.write(part)
        out.flush()
        progress.at_line_start = part.endswith("\n")
        if progress.at_line_start:
            notes.release()


def kv_line(data: dict) -> str:
    """A ``kv`` event (the run's KV usage: its own pages and its tenant's, never other tenants')
    for people: ``kv: 12 tokens in 1 page of this run; the tenant holds 3 device pages, 0 in
    host memory``."""
    run = plural(int(data.get("run_pages") or 0), "page")
    device = plural(int(data.get("tenant_device_pages") or 0), "device page")
    host = int(data.get("tenant_host_pages") or 0)
    return (
        f"kv: {plural(int(data.get('tokens') or 0), 'token')} in {run} of this run;"
        f" the tenant holds {device}, {host} in host memory"
    )


def _closing_line(run: Run, status: str, elapsed: float, verbose: bool = False) -> str:
    line = f"run {run['id']} {status} after {elapsed:.1f}s"
    if status == "cancelled":
        # What the stopped program reported (a ConnectionLost traceback) is the cancel's
        # echo, not news: said with --verbose only.
        line += "\n" + cancelled_line(run)
        if verbose and run.get("error"):
            line += f"\n{run['error']}"
    elif run.get("error"):
        line += f": {run['error']}"
    if run.get("result") is not None:
        line += f"\nresult: {json.dumps(run['result'])}"
    return line


def cancelled_line(run: Run) -> str:
    """Who ended a cancelled run and when. Only a cancel request (the API's, this CLI's, or its
    parent's, which cancels the runs it spawned) gives a run that status."""
    at = _local_time(run.get("finished_at"))
    if run.get("parent"):
        return f"Cancelled at {at} (by you, or with run {run['parent']} that spawned it)"
    return f"Cancelled by you at {at}"


def _local_time(stamp: str | None) -> str:
    try:
        when = datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).astimezone()
    except ValueError:
        when = datetime.now().astimezone()
    return when.strftime("%Y-%m-%d %H:%M:%S %Z")


def _interrupted(client: Client, run_id: str, err: TextIO, stdin: TextIO) -> int:
    """Ctrl-C while following: from a terminal, offer to cancel the run; then say how to re-attach."""
    if stdin.isatty():
        err.write(f"\ncancel run {run_id}? [y/N] ")
        err.flush()
        try:
            answer = stdin.readline().strip().lower()
        except KeyboardInterrupt:
            answer = ""
        if answer in ("y", "yes"):
            try:
                run = client.cancel_run(run_id)
            except ApiError as exc:
                err.write(f"error: could not cancel run {run_id}: {exc}\n")
                return EXIT_ERROR
            err.write(f"run {run_id} {run['status']}\n{cancelled_line(run)}\n")
            return EXIT_INTERRUPTED
    err.write(
        f"\nstopped following run {run_id}; it goes on. Re-attach: symphony follow {run_id}"
        f"  (cancel: symphony cancel {run_id})\n"
    )
    return EXIT_INTERRUPTED
