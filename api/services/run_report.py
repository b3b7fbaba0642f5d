"""What one run used and how long each phase took, as ``GET /runs/<id>`` shows it.

Built from the run's usage row (written once when it ends, from the worker's session counters
and the sandbox's duration) and its timestamps; nothing here is stored twice.
"""

from __future__ import annotations

from datetime import datetime

from api.models import Run, UsageRecord
from api.services import billing

#: The run's counters, in the order shown: billed ones and the details kept beside them.
SHOWN = (
    "prefill_tokens",
    "cached_tokens",
    "decode_tokens",
    "pred_calls",
    "forwards",
    "page_seconds",
    "sandbox_seconds",
    "io_calls",
    "streamed_events",
    "streamed_bytes",
)


def usage(run: Run) -> dict | None:
    """The run's counters and cost; ``None`` until the run has ended and its usage is recorded."""
    try:
        record = run.usage
    except UsageRecord.DoesNotExist:
        return None
    if record is None:
        return None
    out: dict = {name: getattr(record, name) for name in SHOWN}
    out["page_seconds"] = round(float(record.page_seconds), 3)
    out["sandbox_seconds"] = round(float(record.sandbox_seconds), 3)
    out["cost"] = billing.usage_cost(run.tenant, record)
    return out


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return round(max(0.0, (end - start).total_seconds()), 3)


def timings(run: Run) -> dict:
    """Seconds of each phase so far (``None`` for one that has not happened):
    ``queue_wait_s`` created -> started, ``run_s`` started -> finished, ``time_to_first_token_s``
    created -> the first thing the program sent its client (queue wait and sandbox start included:
    what a client streaming the run waits)."""
    return {
        "queue_wait_s": _seconds(run.created_at, run.started_at),
        "run_s": _seconds(run.started_at, run.finished_at),
        "time_to_first_token_s": _seconds(run.created_at, run.first_output_at),
    }
