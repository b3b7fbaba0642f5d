"""Python client for the Symphony HTTP API."""

from symphony_client.client import ApiError, Client, Event, StreamLost
from symphony_client.types import TERMINAL_STATUSES, Program, ProgramVersion, Pushed, Run, RunLogs, RunTrace, TraceSpan

__all__ = [
    "TERMINAL_STATUSES",
    "ApiError",
    "Client",
    "Event",
    "Program",
    "ProgramVersion",
    "Pushed",
    "Run",
    "RunLogs",
    "RunTrace",
    "StreamLost",
    "TraceSpan",
]
