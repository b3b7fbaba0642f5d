"""What the client's calls return: the API's JSON objects, typed.

They are ``TypedDict``s, so they stay plain dicts at run time (``run["status"]`` keeps working,
``json.dumps(run)`` too) while a type checker knows their keys. ``Pushed`` is a named tuple so
``program, version = client.push_program(...)`` unpacks as before and ``pushed.version`` reads.
"""

from __future__ import annotations

from typing import Any, NamedTuple, NotRequired, TypedDict

#: A run's status once it can no longer change.
TERMINAL_STATUSES = frozenset({"succeeded", "failed", "timed_out", "cancelled"})


class Run(TypedDict):
    id: str
    program: int
    version: int
    status: str  # queued | running | succeeded | failed | timed_out | cancelled
    args: dict[str, Any]
    limits: dict[str, Any]
    result: Any
    error: str
    exit_code: int | None
    worker: str
    created_at: str
    started_at: str | None
    finished_at: str | None
    #: The run that spawned this one (``symphony.spawn``), its level in the tree, and what of
    #: the bundle it runs (``module:function``; empty: the program's main).
    parent: NotRequired[str | None]
    depth: NotRequired[int]
    entry: NotRequired[str]
    #: One run only (not in listings): counters and cost once it ended, seconds of each phase,
    #: and the runs it spawned (``{id, status, entry}``, oldest first).
    usage: NotRequired[dict[str, Any] | None]
    timings: NotRequired[dict[str, float | None]]
    children: NotRequired[list[dict[str, Any]]]


class Program(TypedDict):
    id: int
    name: str
    description: str
    default_args: dict[str, Any]
    created_at: str
    latest_version: int | None


class ProgramVersion(TypedDict):
    number: int
    kind: str  # py | zip
    sha256: str
    size: int
    created_at: str


class RunLogs(TypedDict):
    id: str
    status: str
    stdout: str
    stderr: str
    truncated: bool


class Pushed(NamedTuple):
    """``push_program``'s answer: the program and the version number its file now is."""

    program: Program
    version: int


class TraceSpan(TypedDict):
    """One span of a run's trace (``GET /runs/<id>/trace``); times in seconds since the run
    was created. ``attrs`` of an aggregated span (``aggregated: true``) carry its ``count``."""

    id: int
    parent: int | None
    name: str
    kind: str  # run | control | sandbox | worker | syscall | io | wait | kv_move | child
    start_s: float
    end_s: float
    duration_s: float
    attrs: dict[str, Any]


class RunTrace(TypedDict):
    run: str
    status: str
    created_at: str
    #: False until the run's executor recorded its spans (when the run ended).
    complete: bool
    #: "off": the worker ran with ``--trace off`` (no per-call spans); None until recorded.
    worker_tracing: str | None
    spans_kept: int
    dropped: int
    children_left_out: int
    spans: list[TraceSpan]
