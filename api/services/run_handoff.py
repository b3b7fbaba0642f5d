"""A finished in-process run handed to the request that waits on it, instead of a database read.

Why: an OpenAI request waits on its run's event stream and, at the ``end`` event, needs the run
row (result, status, error, and the usage row's metered ``cached_tokens``) that the executor
committed a moment earlier. For a run executed in this very process
(api/services/trusted_runs.py) reading it is a PostgreSQL connection opened and a query, ~10 ms
of a 1-token request's ~30 ms from "run recorded" to "client has the answer" on the benchmark
host (bench/NOTES.md, B11), to fetch what this process's own executor thread holds.

``finish_run`` offers each run it records (:func:`offer`, after the commit, before the ``end``
event is published); only runs this process dispatched in-process were expected
(:func:`expect`), so nothing else is kept. The waiting view takes its run (:func:`take`) when
the ``end`` event arrives, and falls back to the database when there is none (a run executed
through Celery, or one this process did not start). What is handed over is a copy of the row as
committed, with its usage row attached, so the view and the executor thread never share an
instance. Both maps are bounded: a run whose request went away is forgotten, oldest first.
"""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict

from api.models import Run, UsageRecord

#: Runs expected, and recorded runs not taken yet, kept at most (each a few KB at most).
MAX_KEPT = 1024

_lock = threading.Lock()
_expected: OrderedDict[str, None] = OrderedDict()
_recorded: OrderedDict[str, Run] = OrderedDict()


def _bounded_put(store: OrderedDict, key: str, value: object) -> None:
    store[key] = value
    while len(store) > MAX_KEPT:
        store.popitem(last=False)


def expect(run_id: object) -> None:
    """``run_id`` is executed in this process: keep it when it is recorded."""
    with _lock:
        _bounded_put(_expected, str(run_id), None)


def offer(run: Run, usage: UsageRecord) -> None:
    """``finish_run``: ``run`` (with ``usage``) was committed; kept when it was expected."""
    key = str(run.pk)
    with _lock:
        if key not in _expected:
            return
        del _expected[key]
    done = copy.copy(run)
    done.usage = usage  # the reverse one-to-one's cache: what select_related("usage") would give
    with _lock:
        _bounded_put(_recorded, key, done)


def take(run_id: object) -> Run | None:
    """The recorded run ``run_id`` once (its ``end`` event has been seen), else ``None``."""
    key = str(run_id)
    with _lock:
        _expected.pop(key, None)
        return _recorded.pop(key, None)
