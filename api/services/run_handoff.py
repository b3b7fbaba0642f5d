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

A request that needs only the run's end (a ``/v1`` answer not streamed) waits for the offer
itself (:func:`recorded`) instead of reading the run's stream to its ``end``: the stream holds an
event per token of the answer, each one a wake-up, a Redis read and a parse in this process.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import threading
from collections import OrderedDict
from collections.abc import Callable

from api.models import Run, UsageRecord

#: Runs expected, and recorded runs not taken yet, kept at most (each a few KB at most).
MAX_KEPT = 1024

_lock = threading.Lock()
_expected: OrderedDict[str, None] = OrderedDict()
_recorded: OrderedDict[str, Run] = OrderedDict()
#: Requests waiting in :func:`recorded`: what wakes each (one per waiting request, removed when
#: it stops waiting).
_waiters: dict[str, Callable[[], object]] = {}


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
        wake = _waiters.pop(key, None)
    if wake is not None:
        try:
            wake()
        except RuntimeError:  # its event loop closed: nobody waits any more
            pass


def pending(run_id: object) -> bool:
    """Whether ``run_id`` was dispatched in this process and not taken yet (its record is or
    will be offered here, unless its executor fails before recording it)."""
    key = str(run_id)
    with _lock:
        return key in _expected or key in _recorded


async def recorded(run_id: object, timeout: float) -> bool:
    """Wait until ``run_id`` is offered (True), at most ``timeout`` seconds (False)."""
    key = str(run_id)
    loop = asyncio.get_running_loop()
    offered = asyncio.Event()
    with _lock:
        if key in _recorded:
            return True
        _waiters[key] = functools.partial(loop.call_soon_threadsafe, offered.set)
    try:
        await asyncio.wait_for(offered.wait(), timeout)
        return True
    except TimeoutError:
        return False
    finally:
        with _lock:
            _waiters.pop(key, None)


def take(run_id: object) -> Run | None:
    """The recorded run ``run_id`` once (its ``end`` event has been seen), else ``None``."""
    key = str(run_id)
    with _lock:
        _expected.pop(key, None)
        return _recorded.pop(key, None)
