"""What a 5xx answer tells its client: a generic message and a request id, never the cause.

A failed built-in /v1 run's error text (``Type: message`` and the program's last frames, with
``.../api/builtin_lips/openai_lip.py``) went into the 500 body as it was, and a worker that
could not be reached put its socket error in a 503: server paths, tracebacks and exception text,
to anyone. The cause is logged here instead, with its traceback, under an id the body carries,
so an operator finds it from what the client quotes.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from api.models import Run

log = logging.getLogger("symphony.server_errors")


def record(what: str, detail: str = "", exc_info: Any = None) -> str:
    """Log a server-side failure (``detail``, and the traceback of ``exc_info`` if given) under
    a fresh request id, and return the id for the response body."""
    request_id = f"req_{uuid.uuid4().hex}"
    log.error("event=server_error request_id=%s what=%s detail=%r", request_id, what, detail, exc_info=exc_info)
    return request_id


def run_failure(run: Run) -> tuple[str, str]:
    """``(message, request_id)`` for the client of a /v1 request whose run failed or timed out:
    the message names the run and its status only; the run's error is logged under the id."""
    request_id = record("run_failed", f"run={run.pk} status={run.status} error={run.error}")
    words = "timed out" if run.status == "timed_out" else run.status
    return f"run {run.pk} {words}; quote request_id {request_id} to the operator", request_id
