"""``GET /api/v1/runs/<id>/events``: Server-Sent Events from the Redis stream ``run:<id>``.

An async Django view (not DRF) so that under ASGI each client holds a coroutine, not a thread.
Event ids are the stream entry ids, so a reconnecting client resumes with Last-Event-ID. The
stream closes after the ``end`` event, or with a 404 for a run outside the caller's tenant.
While Redis is unreachable (a restart, a failover) the stream stays open with keep-alives and
reconnects for up to ``REDIS_RETRY_S``, continuing after the last entry it sent; past that it
closes without ``end`` and the client resumes with Last-Event-ID.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import redis.asyncio as aioredis
import redis.exceptions
from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpRequest, JsonResponse, StreamingHttpResponse

from api.models import Membership, Run
from api.services.keys import verify_key
from api.tenancy import SESSION_TENANT_KEY

log = logging.getLogger(__name__)

BLOCK_MS = 1000
HEARTBEAT_EVERY = 15
REDIS_RETRY_S = 30.0


def _error(status: int, code: str, message: str) -> JsonResponse:
    return JsonResponse({"error": {"code": code, "message": message, "detail": None}}, status=status)


def _tenant_id(request: HttpRequest) -> int | None:
    header = request.headers.get("Authorization", "")
    if header.startswith("Bearer "):
        key = verify_key(header[len("Bearer ") :].strip())
        return key.tenant_id if key and "runs" in key.scopes else None
    if not request.user.is_authenticated:
        return None
    memberships = Membership.objects.filter(user=request.user)
    wanted = request.session.get(SESSION_TENANT_KEY)
    chosen = memberships.filter(tenant_id=wanted).first() if wanted else None
    chosen = chosen or memberships.order_by("id").first()
    return chosen.tenant_id if chosen else None


def _run_exists(run_id: uuid.UUID, tenant_id: int) -> bool:
    return Run.objects.filter(pk=run_id, tenant_id=tenant_id).exists()


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


async def _stream(run_id: uuid.UUID, last_id: str) -> AsyncIterator[bytes]:
    async for entry in stream_entries(run_id, last_id):
        if entry.type is None:
            yield b": keep-alive\n\n"
        else:
            yield f"id: {entry.id}\nevent: {entry.type}\ndata: {entry.data}\n\n".encode()


async def run_events(request: HttpRequest, run_id: uuid.UUID):
    tenant_id = await sync_to_async(_tenant_id)(request)
    if tenant_id is None:
        return _error(401, "not_authenticated", "authentication required")
    if not await sync_to_async(_run_exists)(run_id, tenant_id):
        return _error(404, "not_found", "no such run")
    last_id = request.headers.get("Last-Event-ID") or request.GET.get("last_event_id") or "0-0"
    response = StreamingHttpResponse(_stream(run_id, last_id), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response
