"""``GET /api/v1/runs/<id>/events``: Server-Sent Events from the Redis stream ``run:<id>``.

An async Django view (not DRF) so that under ASGI each client holds a coroutine, not a thread.
Event ids are the stream entry ids, so a reconnecting client resumes with Last-Event-ID. The
stream closes after the ``end`` event, or with a 404 for a run outside the caller's tenant.
While Redis is unreachable (a restart, a failover) the stream stays open with keep-alives and
reconnects for up to ``REDIS_RETRY_S``, continuing after the last entry it sent; past that it
closes without ``end`` and the client resumes with Last-Event-ID.

A finished run's stream is replayed without blocking: what is after Last-Event-ID up to its
``end``, then closed. A client resuming after it already had the ``end`` gets 204 (an
EventSource stops reconnecting on 204). Streams expire ``SYMPHONY_RUN_EVENTS_RETENTION_S`` after
the run ends (api/services/runs.py); a finished run whose stream is gone, or whose ``end`` is not
in Redis yet, gets ``status`` and ``end`` events built from its row, so no client waits forever
on a run that will publish nothing more.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import redis.asyncio as aioredis
import redis.exceptions
from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from rest_framework.exceptions import PermissionDenied

from api.authentication import KeyRefused, bearer_key
from api.models import Run
from api.tenancy import active_tenant
from api.throttling import TenantThrottled, check_tenant_rate

log = logging.getLogger(__name__)

BLOCK_MS = 1000
HEARTBEAT_EVERY = 15
REDIS_RETRY_S = 30.0
#: A stream entry id as Redis writes it (``<ms>-<seq>``), or its ``<ms>`` part alone.
EVENT_ID = re.compile(r"(\d{1,20})(?:-(\d{1,20}))?")
MAX_ID_PART = 2**64 - 1
#: How far back from a finished stream's tail its ``end`` is looked for (late entries of the
#: worker may follow the ``end`` the executor wrote).
END_LOOKBACK = 64


def _error(status: int, code: str, message: str) -> JsonResponse:
    return JsonResponse({"error": {"code": code, "message": message, "detail": None}}, status=status)


class _Refused(Exception):
    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers or {}

    def response(self) -> JsonResponse:
        response = _error(self.status, self.code, self.message)
        for name, value in self.headers.items():
            response[name] = value
        return response


def _tenant_id(request: HttpRequest) -> int | None:
    """The caller's tenant; ``None`` without credentials (or for a user in no tenant);
    :class:`_Refused` for a key that is wrong (401), throttled (429) or lacks the ``runs`` scope
    (403), and for a tenant over its request rate (429), as the DRF routes answer."""
    try:
        key = bearer_key(request)
    except KeyRefused as refused:
        if refused.status == 429:
            raise _Refused(429, "throttled", refused.message, {"Retry-After": str(refused.retry_after)}) from None
        raise _Refused(401, "authentication_failed", refused.message) from None
    if key is not None:
        if "runs" not in key.scopes:
            raise _Refused(403, "permission_denied", "this API key lacks the 'runs' scope")
        tenant = key.tenant
    elif not request.user.is_authenticated:
        return None
    else:
        try:
            tenant = active_tenant(request)  # the console session's active tenant
        except PermissionDenied:
            return None
    try:
        check_tenant_rate(tenant, request)
    except TenantThrottled as throttled:
        raise _Refused(429, "throttled", str(throttled), {"Retry-After": str(throttled.retry_after)}) from None
    return tenant.pk


def _run_status(run_id: uuid.UUID, tenant_id: int) -> str | None:
    return Run.objects.filter(pk=run_id, tenant_id=tenant_id).values_list("status", flat=True).first()


def parse_event_id(raw: str) -> tuple[int, int]:
    """A Last-Event-ID as ``(ms, seq)``; ``ValueError`` for anything Redis would not take."""
    match = EVENT_ID.fullmatch(raw)
    if match is None:
        raise ValueError("Last-Event-ID must be an event id of this stream, like 1700000000000-0")
    ms, seq = int(match[1]), int(match[2] or 0)
    if ms > MAX_ID_PART or seq > MAX_ID_PART:
        raise ValueError("Last-Event-ID is out of range")
    return ms, seq


@dataclass(frozen=True)
class StreamEntry:
    """One event of a run's stream; ``type`` ``None`` marks an idle heartbeat tick."""

    id: str
    type: str | None
    data: str


async def stream_entries(run_id: uuid.UUID | str, last_id: str = "0-0") -> AsyncIterator[StreamEntry]:
    """Entries of ``run:<id>`` after ``last_id`` until (and including) ``end``; a heartbeat
    entry every ``HEARTBEAT_EVERY`` seconds of silence lets callers keep connections alive."""
    client = aioredis.Redis.from_url(settings.REDIS_URL)
    idle = 0
    down_since: float | None = None
    try:
        while True:
            try:
                batch = await client.xread({f"run:{run_id}": last_id}, block=BLOCK_MS, count=100)
                down_since = None
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
                now = asyncio.get_running_loop().time()
                down_since = down_since or now
                if now - down_since > REDIS_RETRY_S:
                    raise
                log.warning("event=sse_redis_retry run=%s error=%r", run_id, exc)
                yield StreamEntry(last_id, None, "")  # keep the client's connection alive
                await asyncio.sleep(1.0)
                continue
            if not batch:
                idle += 1
                if idle * BLOCK_MS >= HEARTBEAT_EVERY * 1000:
                    idle = 0
                    yield StreamEntry(last_id, None, "")
                continue
            idle = 0
            for entry_id, fields in batch[0][1]:
                last_id = entry_id.decode()
                type_ = fields.get(b"type", b"message").decode()
                yield StreamEntry(last_id, type_, fields.get(b"data", b"{}").decode())
                if type_ == "end":
                    return
    finally:
        await client.aclose()


def _sse(entry: StreamEntry) -> bytes:
    if entry.type is None:
        return b": keep-alive\n\n"
    head = f"id: {entry.id}\n" if entry.id else ""
    return f"{head}event: {entry.type}\ndata: {entry.data}\n\n".encode()


async def _stream(run_id: uuid.UUID, last_id: str) -> AsyncIterator[bytes]:
    async for entry in stream_entries(run_id, last_id):
        yield _sse(entry)


def _decode(entry_id: bytes, fields: dict) -> StreamEntry:
    return StreamEntry(entry_id.decode(), fields.get(b"type", b"message").decode(), fields.get(b"data", b"{}").decode())


async def finished_entries(run_id: uuid.UUID, last_id: str) -> list[StreamEntry] | None:
    """What a client of a finished run has not seen yet: the entries after ``last_id`` up to
    and including the stream's ``end`` (all of them if Redis holds no ``end``: the stream
    expired, or the executor has not written it yet); ``None`` if it already had the ``end``."""
    key = f"run:{run_id}"
    client = aioredis.Redis.from_url(settings.REDIS_URL)
    try:
        tail = [_decode(i, f) for i, f in await client.xrevrange(key, count=END_LOOKBACK)]
        end = next((e for e in tail if e.type == "end"), None)
        if end is not None and parse_event_id(end.id) <= parse_event_id(last_id):
            return None
        found = await client.xrange(key, min=f"({last_id}", max=end.id if end else "+")
    finally:
        await client.aclose()
    return [_decode(i, f) for i, f in found]


def _closing_events(run: Run) -> list[StreamEntry]:
    """``status`` and ``end`` of a finished run from its row, as the executor publishes them."""
    status = json.dumps({"status": run.status, "error": run.error})
    end = json.dumps({"status": run.status, "result": run.result})
    return [StreamEntry("", "status", status), StreamEntry("", "end", end)]


async def _replay(run_id: uuid.UUID, entries: list[StreamEntry]) -> AsyncIterator[bytes]:
    for entry in entries:
        yield _sse(entry)
    if not entries or entries[-1].type != "end":
        run = await Run.objects.aget(pk=run_id)
        for entry in _closing_events(run):
            yield _sse(entry)


async def run_events(request: HttpRequest, run_id: uuid.UUID):
    try:
        tenant_id = await sync_to_async(_tenant_id)(request)
    except _Refused as refused:
        return refused.response()
    if tenant_id is None:
        return _error(401, "not_authenticated", "authentication required")
    status = await sync_to_async(_run_status)(run_id, tenant_id)
    if status is None:
        return _error(404, "not_found", "no such run")
    last_id = request.headers.get("Last-Event-ID") or request.GET.get("last_event_id") or "0-0"
    try:
        parse_event_id(last_id)
    except ValueError as exc:
        return _error(400, "invalid", str(exc))
    if status in Run.TERMINAL:
        entries = await finished_entries(run_id, last_id)
        if entries is None:
            return HttpResponse(status=204)  # had the end already; EventSource stops on 204
        events = _replay(run_id, entries)
    else:
        events = _stream(run_id, last_id)
    response = StreamingHttpResponse(events, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response
