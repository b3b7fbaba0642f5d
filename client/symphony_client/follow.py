"""``symphony run --follow`` / ``symphony follow RUN``: stream a run until it ends and turn its
final status into the exit code.

Human mode writes what the program produced (tokens, ``send_to_user`` messages) to stdout and
everything about the run (status changes, elapsed time while nothing streams, the closing line)
to stderr, so ``symphony follow RUN > answer.txt`` keeps only the answer. JSON mode writes JSON
Lines to stdout, one object per event. Ctrl-C never leaves a traceback: from a terminal it asks
whether to cancel the run; otherwise (or on "no") it says how to re-attach and exits 130.
"""

from __future__ import annotations

import json
import threading
import time
from typing import TextIO

from symphony_client.client import ApiError, Client
from symphony_client.types import TERMINAL_STATUSES, Run

#: Exit codes (documented in client/README.md).
EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_CANCELLED, EXIT_TIMED_OUT, EXIT_INTERRUPTED = 0, 1, 2, 3, 4, 130
EXIT_BY_STATUS = {"succeeded": EXIT_OK, "failed": EXIT_ERROR, "cancelled": EXIT_CANCELLED, "timed_out": EXIT_TIMED_OUT}
SPINNER = "|/-\\"


class Progress:
    """A ``running 12s`` line on a terminal's stderr, redrawn while no output streams. It is
    drawn only when stdout's text ends a line, so it never overwrites half a line of tokens."""

    def __init__(self, err: TextIO, enabled: bool, quiet_s: float = 1.0) -> None:
        self._err, self._enabled, self._quiet_s = err, enabled, quiet_s
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
                if not self.at_line_start or time.monotonic() - self._last < self._quiet_s:
                    continue
                turn += 1
                self._err.write(f"\r\033[K{SPINNER[turn % 4]} {self.status} {self.elapsed():.0f}s")
                self._err.flush()
                self._shown = True


def follow(client: Client, run_id: str, as_json: bool, out: TextIO, err: TextIO, stdin: TextIO) -> int:
    """Stream the run's events until ``end``; returns the exit code of its final status."""
    progress = Progress(err, enabled=not as_json and err.isatty())
    try:
        with progress:
            ended = _stream(client, run_id, as_json, out, err, progress)
            run = client.get_run(run_id)
    except KeyboardInterrupt:
        if not progress.at_line_start:
            out.write("\n")
            out.flush()
        return _interrupted(client, run_id, err, stdin)
    status = run["status"] if run["status"] in TERMINAL_STATUSES else ended.get("status", run["status"])
    if as_json:
        out.write(json.dumps({"event": "run", "data": run}) + "\n")
    else:
        if not progress.at_line_start:
            out.write("\n")
        err.write(_closing_line(run, status, progress.elapsed()) + "\n")
    out.flush()
    return EXIT_BY_STATUS.get(status, EXIT_ERROR)


def _stream(client: Client, run_id: str, as_json: bool, out: TextIO, err: TextIO, progress: Progress) -> dict:
    """Write each event; returns the ``end`` event's data."""
    for event in client.events(run_id):
        progress.clear()
        data = event.data if isinstance(event.data, dict) else {"value": event.data}
        if as_json:
            out.write(json.dumps({"event": event.type, "id": event.id, "data": event.data}) + "\n")
            out.flush()
        elif event.type == "token":
            text = str(data.get("text", ""))
            out.write(text)
            out.flush()
            progress.at_line_start = progress.at_line_start if text == "" else text.endswith("\n")
        elif event.type == "message":
            message = data.get("data")
            prefix = "" if progress.at_line_start else "\n"
            out.write(prefix + (message if isinstance(message, str) else json.dumps(message)) + "\n")
            out.flush()
            progress.at_line_start = True
        elif event.type == "status":
            progress.status = str(data.get("status", "?"))
            if progress.status not in TERMINAL_STATUSES:  # the closing line says the final one
                _note(err, out, progress, f"run {run_id}: {progress.status}")
        elif event.type == "kv":
            _note(err, out, progress, f"kv: {json.dumps(data)}")
        elif event.type == "channel":  # a message the run sent to a run of its tree
            verb = "published on" if data.get("op") == "publish" else "sent on"
            _note(err, out, progress, f"{verb} channel {data.get('channel')}: {json.dumps(data.get('data'))}")
        if event.type == "end":
            return data
    return {}


def _note(err: TextIO, out: TextIO, progress: Progress, text: str) -> None:
    """A line about the run on stderr, on a line of its own."""
    if not progress.at_line_start:
        out.write("\n")
        out.flush()
        progress.at_line_start = True
    err.write(text + "\n")
    err.flush()


def _closing_line(run: Run, status: str, elapsed: float) -> str:
    line = f"run {run['id']} {status} after {elapsed:.1f}s"
    if run.get("error"):
        line += f": {run['error']}"
    if run.get("result") is not None:
        line += f"\nresult: {json.dumps(run['result'])}"
    return line


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
            err.write(f"run {run_id} {run['status']}\n")
            return EXIT_INTERRUPTED
    err.write(
        f"\nstopped following run {run_id}; it goes on. Re-attach: symphony follow {run_id}"
        f"  (cancel: symphony cancel {run_id})\n"
    )
    return EXIT_INTERRUPTED
