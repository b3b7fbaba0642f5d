"""Per-session metering: what a run consumed, returned by ``end_session`` and billed upstream."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field


@dataclass
class Usage:
    """Counters of one session. ``page_seconds`` integrates device pages held over wall time
    (its share of pages other sessions hold too: ``KVFS.live_usage``)."""

    prefill_tokens: int = 0
    decode_tokens: int = 0
    pred_calls: int = 0
    page_seconds: float = 0.0
    io_calls: int = 0
    #: Bytes of the run's events that its LIP sent with ``send_to_user`` (as stored in Redis).
    streamed_bytes: int = 0
    #: Events it sent that way, and when the first went out (Unix seconds; 0: none yet).
    streamed_events: int = 0
    first_stream_at: float = 0.0
    #: Prompt tokens computed before, not by this run: mapped from the tenant's prefix cache
    #: (gpu_worker/kvfs/prefix.py) or held by stored KV files it opened (``kv_open``). Billed at
    #: the plan's cached-token price, not as prefill.
    cached_tokens: int = 0
    #: Forward passes that carried at least one of the run's ``pred`` calls.
    forwards: int = 0
    _pages: float = field(default=0.0, repr=False)
    _since: float = field(default_factory=time.monotonic, repr=False)

    def add_tokens(self, n: int, prefill: bool | None = None) -> None:
        """A single-token append is a decode step; anything longer counts as prefill. ``prefill``
        says it for a chunk of a longer call (a prompt whose cached prefix left one token)."""
        if (n == 1) if prefill is None else not prefill:
            self.decode_tokens += 1
        else:
            self.prefill_tokens += n

    @property
    def total_tokens(self) -> int:
        return self.prefill_tokens + self.decode_tokens

    def sample_pages(self, pages_now: float, now: float | None = None) -> None:
        """Integrate the page count held since the last sample, then remember ``pages_now``."""
        now = time.monotonic() if now is None else now
        self.page_seconds += self._pages * max(0.0, now - self._since)
        self._pages = pages_now
        self._since = now

    def to_dict(self) -> dict[str, float | int]:
        out = {k: v for k, v in asdict(self).items() if not k.startswith("_")}
        out["page_seconds"] = round(self.page_seconds, 6)
        return out
