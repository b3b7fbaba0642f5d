"""Capture of a sandbox's stdout/stderr with a byte cap, and extraction of the result record.

The runner (``symphony.run``) prints one line ``RESULT_MARKER + json`` after the program's own
output. Those bytes do not count against the program's output cap (the result is bounded by the
worker's own limit), every other byte does. Past the cap the collector stops storing and reports
``exceeded`` so the launcher can kill the container: a 1 GB flood costs at most the cap in memory.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any

#: Must equal ``symphony.run.RESULT_MARKER`` (checked by a test; the host does not import the SDK).
RESULT_MARKER = b"\x1esymphony-result:"
#: Largest result record accepted (the worker caps results at 1 MiB of msgpack; JSON is larger).
MAX_RECORD_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class Captured:
    stdout: str
    stderr: str
    total_bytes: int
    exceeded: bool
    record: dict[str, Any] | None


class OutputCollector:
    """Thread-safe sink for demultiplexed ``(stdout, stderr)`` chunks."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit = max(0, int(limit_bytes))
        self._lock = threading.Lock()
        self._out = bytearray()
        self._err = bytearray()
        self._line = bytearray()  # current stdout line while it may still be a record
        self._line_is_record: bool | None = None
        self._record: bytes | None = None
        self.total = 0
        self.exceeded = False
        #: Set when a complete record line has arrived: the runner prints it last and exits.
        self.record_seen = threading.Event()

    def _count(self, buf: bytearray, data: bytes) -> None:
        self.total += len(data)
        room = self.limit - len(self._out) - len(self._err)
        if room > 0:
            buf.extend(data[:room])
        if self.total > self.limit:
            self.exceeded = True

    def feed_stderr(self, data: bytes) -> None:
        with self._lock:
            self._count(self._err, data)

    def feed_stdout(self, data: bytes) -> None:
        """Split stdout into lines lazily: only a line that starts with the marker is held back."""
        with self._lock:
            while data:
                nl = data.find(b"\n")
                piece, data = (data, b"") if nl < 0 else (data[: nl + 1], data[nl + 1 :])
                self._feed_line_piece(piece, ended=nl >= 0)

    def _feed_line_piece(self, piece: bytes, ended: bool) -> None:
        if self._line_is_record is None:
            self._line.extend(piece)
            head = bytes(self._line[: len(RESULT_MARKER)])
            if RESULT_MARKER.startswith(head) and len(head) < len(RESULT_MARKER) and not ended:
                return  # undecided: too short to tell yet
            self._line_is_record = head == RESULT_MARKER
            piece = bytes(self._line)
            self._line.clear()
            if not self._line_is_record:
                self._count(self._out, piece)
            else:
                self._hold_record(piece)
        elif self._line_is_record:
            self._hold_record(piece)
        else:
            self._count(self._out, piece)
        if ended:
            if self._line_is_record:
                self._record = bytes(self._line)
                self.record_seen.set()
            self._line.clear()
            self._line_is_record = None

    def _hold_record(self, piece: bytes) -> None:
        """Keep a record line aside; one larger than any real record is just output."""
        if len(self._line) + len(piece) > MAX_RECORD_BYTES:
            self._line_is_record = False
            self._count(self._out, bytes(self._line) + piece)
            self._line.clear()
        else:
            self._line.extend(piece)

    def last_record_line(self) -> bytes | None:
        """The last complete record line seen (marker + JSON + newline), for the warm pool to
        know that all stdout written before it has arrived."""
        with self._lock:
            return self._record

    def result(self) -> Captured:
        with self._lock:
            record: dict[str, Any] | None = None
            raw = self._record
            if raw is None and self._line_is_record:
                raw = bytes(self._line)
            if raw is not None:
                try:
                    parsed = json.loads(raw[len(RESULT_MARKER) :])
                    record = parsed if isinstance(parsed, dict) else None
                except ValueError:
                    record = None
            out = bytes(self._out)
            if record is not None and out.endswith(b"\n"):
                out = out[:-1]  # the newline the runner put before its record
            return Captured(
                out.decode("utf-8", "replace"),
                bytes(self._err).decode("utf-8", "replace"),
                self.total,
                self.exceeded,
                record,
            )
