"""``GET /api/v1/runs/<id>/events``: Server-Sent Events from the Redis stream ``run:<id>``.

The stream's key and entries are the contract in ``gpu_worker/contracts.py``; each entry's
``data`` is passed through as stored, so an SSE client parses exactly what the writer encoded.

An async Django view (not DRF) so that under ASGI each client holds a coroutine, not a thread.
Event ids are the stream entry ids, so a reconnecting client resumes with Last-Event-ID. The
stream closes after the ``end`` event, or with a 404 for a run outside the caller's tenant.
While Redis is unreachable (a restart, a failover) the stream stays open with keep-alives and
reconnects for up to ``REDIS_RETRY_S``, continuing after the last entry it sent; past that it
closes without ``end`` and the client resumes with Last-Event-ID.

A finished run's stream is replayed without blocking, read from Redis in pages of at most
``replay_memory.PAGE_BYTES`` (1 MiB; one entry may pass it), each sent before the next is read:
what is after Last-Event-ID up to its ``end``, then closed. A replay holds a slot of the web
process's replay memory (api/services/replay_memory.py, a share per account; past it 429
``throttled`` with ``Retry-After``) and is stopped, freeing it, when its client takes nothing for
``SYMPHONY_REPLAY_STALL_S``. A client
resuming after it already had the ``end`` gets 204 (an EventSource stops reconnecting on 204).
Streams expire ``SYMPHONY_RUN_EVENTS_RETENTION_S`` after the run ends (api/services/runs.py);
a finished run whose stream is gone, or whose ``end`` is not in Redis yet, gets ``status`` and
``end`` events built from its row, so no client waits forever on a run that will publish
nothing more.

A waiting stream holds no database connection (api/asyncdb.py), and each tenant may hold its
plan's number of streams at once (api/services/stream_leases.py); past it a 429 ``throttled``
with ``Retry-After``. The slot is given back when the stream ends or its client leaves.
"""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import cast

import redis.asyncio as aioredis
import redis.exceptions
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from rest_framework.exceptions import PermissionDenied

from api import redis_client
from api.asyncdb import db_call
from api.authentication import KeyRefused, bearer_key
from api.db_admission import RETRY_AFTER_S
from api.models import Run, Tenant
from api.services import replay_memory, run_handoff, stream_leases
from api.services.db_share import AccountOverShare
from api.services.quotas import plan_limits
from api.services.runs import closing_events
from api.session_authentication import console_user
from api.tenancy import active_tenant
from api.throttling import TenantThrottled, check_tenant_rate
from gpu_worker import contracts

log = logging.getLogger(__name__)

BLOCK_MS = 1000
#: How often a request waiting on a run of this process looks for its ``end`` itself (``run_ended``).
HANDOFF_CHECK_S = 1.0
HEARTBEAT_EVERY = 15
REDIS_RETRY_S = 30.0
#: A stream entry id as Redis writes it (``<ms>-<seq>``), or its ``<ms>`` part alone.
EVENT_ID = re.compile(r"(\d{1,20})(?:-(\d{1,20}))?")
MAX_ID_PART = 2**64 - 1
#: How far back from a finished stream's tail its ``end`` is looked for (late entries of the
#: worker may follow the ``end`` the executor wrote).
END_LOOKBACK = 64
#: Entries per round trip of a tail lookback: an entry may be up to 1 MiB, and a stream 10,000
#: entries; read whole, one replay grew the web process by hundreds of MB.
LOOKBACK_PAGE = 8
#: Most entries in one replay page (its bytes are bounded by ``replay_memory.PAGE_BYTES``).
REPLAY_MAX_ENTRIES = 512
#: KEYS[1] the stream; ARGV: after (an exclusive ``(id``), until, most entries, most bytes.
#: The entries after ``after`` up to ``until`` until their values reach the bytes (XRANGE's
#: COUNT counts entries, and 100 entries of 1 MiB were one page of 100 MB in the web process).
_PAGE = """
local out, bytes, start = {}, 0, ARGV[1]
for i = 1, tonumber(ARGV[3]) do
  local found = redis.call('XRANGE', KEYS[1], start, ARGV[2], 'COUNT', 1)
  if #found == 0 then break end
  out[#out + 1] = found[1]
  local fields = found[1][2]
  for j = 2, #fields, 2 do bytes = bytes + #fields[j] end
  start = '(' .. found[1][1]
  if bytes >= tonumber(ARGV[4]) then break end
end
return out
"""


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


def _caller(request: HttpRequest) -> Tenant | None:
    """The caller's tenant; ``None`` without credentials (or for a user in no tenant);
    :class:`_Refused` for a key that is wrong (401), throttled (429) or lacks the ``runs`` scope
    (403), for a console session whose account's share of database connections is full (429),
    and for a tenant over its request rate (429), as the DRF routes answer."""
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
    else:
        try:
            person = console_user(request)
        except AccountOverShare as over:
            raise _Refused(429, "throttled", str(over), {"Retry-After": str(RETRY_AFTER_S)}) from None
        if person is None:
            return None
        try:
            tenant = active_tenant(request)  # the console session's active tenant
        except PermissionDenied:
            return None
    try:
        check_tenant_rate(tenant, request)
    except TenantThrottled as throttled:
        raise _Refused(429, "throttled", str(throttled), {"Retry-After": str(throttled.retry_after)}) from None
    return tenant


@dataclass(frozen=True)
class _Admitted:
    tenant_id: int
    account: str
    stream_cap: int
    run_status: str


def _admit(request: HttpRequest, run_id: uuid.UUID) -> _Admitted:
    """Who asks, may they, and where the run stands: every database read the view needs, done
    before streaming starts (see :func:`run_events`)."""
    tenant = _caller(request)
    if tenant is None:
        raise _Refused(401, "not_authenticated", "authentication required")
    status = Run.objects.filter(pk=run_id, tenant=tenant).values_list("status", flat=True).first()
    if status is None:
        raise _Refused(404, "not_found", "no such run")
    return _Admitted(tenant.pk, tenant.account_key, plan_limits(tenant).max_concurrent_streams, status)


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


def _stop_if_cancelled() -> None:
    """Raise ``CancelledError`` when this task was asked to stop while a Redis call was in flight.

    redis-py's asyncio client can swallow a cancellation that lands at the wrong moment of a
    blocking read (it disconnects and returns, or raises a ``ConnectionError``). Django cancels
    the request's task when the client leaves; a swallowed cancellation would leave this loop
    polling XREAD for nobody, holding its Redis connection and the tenant's stream slot. The
    task's pending-cancellation count survives the swallowing, so it is checked after each call."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def run_messages(run_id: uuid.UUID | str) -> AsyncGenerator[dict | None, None]:
    """The ``message`` events a program sent (``send_to_user`` of a dict) as dicts, until the
    run's ``end``; ``None`` where the caller should send a keep-alive. What the ``/v1`` views
    (api/views/openai.py, api/views/responses.py) turn into their own stream formats."""
    async with aclosing(stream_entries(run_id)) as entries:
        async for entry in entries:
            if entry.type is None:
                yield None
            elif entry.type == contracts.MessageEvent.TYPE:
                event = contracts.decode(entry.type, entry.data)
                message = (event.data if isinstance(event, contracts.MessageEvent) else None) or {}
                if isinstance(message, dict):
                    yield message
            elif entry.type == contracts.END:
                return


async def stream_entries(run_id: uuid.UUID | str, last_id: str = "0-0") -> AsyncGenerator[StreamEntry, None]:
    """Entries of ``run:<id>`` after ``last_id`` until (and including) ``end``; a heartbeat
    entry every ``HEARTBEAT_EVERY`` seconds of silence lets callers keep connections alive."""
    # The loop's pooled client (api/redis_client.py): no connect and handshake per stream.
    client = redis_client.shared_async(settings.REDIS_URL)
    idle = 0
    down_since: float | None = None
    while True:
        try:
            reply = await client.xread({contracts.run_stream_key(run_id): last_id}, block=BLOCK_MS, count=100)
            batch = cast(XReadReply, reply)
            down_since = None
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            _stop_if_cancelled()
            now = asyncio.get_running_loop().time()
            down_since = down_since or now
            if now - down_since > REDIS_RETRY_S:
                raise
            log.warning("event=sse_redis_retry run=%s error=%r", run_id, exc)
            yield StreamEntry(last_id, None, "")  # keep the client's connection alive
            await asyncio.sleep(1.0)
            continue
        _stop_if_cancelled()
        if not batch:
            idle += 1
            if idle * BLOCK_MS >= HEARTBEAT_EVERY * 1000:
                idle = 0
                yield StreamEntry(last_id, None, "")
            continue
        idle = 0
        for entry_id, fields in batch[0][1]:
            entry = _decode(entry_id, fields)
            last_id = entry.id
            yield entry
            if entry.type == contracts.END:
                return


async def run_ended(run_id: uuid.UUID | str) -> None:
    """Until the run has ended. One executed in this process is handed over by its executor when
    it is recorded (api/services/run_handoff.py): waiting for that reads none of the stream's
    entries (an event per token of the answer), and every ``HANDOFF_CHECK_S`` the stream's
    ``end`` is looked for in case the run ended without being recorded here. Any other run's
    stream is read to its ``end``."""
    if run_handoff.pending(run_id):
        client = redis_client.shared_async(settings.REDIS_URL)
        key = contracts.run_stream_key(run_id)
        while not await run_handoff.recorded(run_id, HANDOFF_CHECK_S):
            if await _end_of(client, key) is not None:
                return
        return
    async with aclosing(stream_entries(run_id)) as entries:
        async for entry in entries:
            if entry.type == contracts.END:
                return


def _sse(entry: StreamEntry) -> bytes:
    if entry.type is None:
        return b": keep-alive\n\n"
    head = f"id: {entry.id}\n" if entry.id else ""
    return f"{head}event: {entry.type}\ndata: {entry.data}\n\n".encode()


async def _stream(run_id: uuid.UUID, last_id: str) -> AsyncGenerator[bytes, None]:
    async with aclosing(stream_entries(run_id, last_id)) as entries:
        async for entry in entries:
            yield _sse(entry)


#: One stream entry as redis-py reads it (``decode_responses`` off): its id and its fields.
StreamRecord = tuple[bytes, dict[bytes, bytes]]
#: ``XREAD`` of one stream: ``[(key, [entry, ...])]``, or empty when the block timed out.
XReadReply = list[tuple[bytes, list[StreamRecord]]]


def _decode(entry_id: bytes, fields: dict) -> StreamEntry:
    return StreamEntry(entry_id.decode(), *contracts.entry_strings(fields))


async def _end_of(client: aioredis.Redis, key: str) -> StreamEntry | None:
    """The stream's ``end`` among its last ``END_LOOKBACK`` entries, read a few at a time."""
    newest = "+"
    seen = 0
    while seen < END_LOOKBACK:
        page = await client.xrevrange(key, max=newest, count=min(LOOKBACK_PAGE, END_LOOKBACK - seen))
        batch = cast(list[StreamRecord], page)
        for entry_id, fields in batch:
            entry = _decode(entry_id, fields)
            if entry.type == contracts.END:
                return entry
        if len(batch) < LOOKBACK_PAGE:
            return None
        seen += len(batch)
        newest = f"({batch[-1][0].decode()}"
    return None


async def entry_pages(
    client: aioredis.Redis,
    key: str,
    after: str,
    until: str = "+",
    max_entries: int = REPLAY_MAX_ENTRIES,
    max_bytes: int = replay_memory.PAGE_BYTES,
) -> AsyncGenerator[list[StreamEntry], None]:
    """The entries of ``key`` after ``after`` up to and including ``until``, a page per round
    trip of at most ``max_entries`` whose values stop at ``max_bytes`` (the entry that reaches
    it included): a replay holds one page in memory, never the whole stream."""
    while True:
        batch = await client.eval(_PAGE, 1, key, f"({after}", until, max_entries, max_bytes)
        if not batch:
            return
        entries = [_decode(i, dict(zip(f[::2], f[1::2], strict=True))) for i, f in batch]
        yield entries
        after = entries[-1].id
        if after == until:
            return


async def finished_end(run_id: uuid.UUID, last_id: str) -> tuple[bool, str]:
    """Where a replay of a finished run's stream stops: ``(already_had_end, until)``, ``until``
    being the id of its ``end`` (``+``: the whole stream, when Redis holds no ``end``: it
    expired, or the executor has not written it yet)."""
    end = await _end_of(redis_client.shared_async(settings.REDIS_URL), contracts.run_stream_key(run_id))
    if end is None:
        return False, "+"
    return parse_event_id(end.id) <= parse_event_id(last_id), end.id


def _closing_events(run: Run) -> list[StreamEntry]:
    """``status`` and ``end`` of a finished run from its row, as the executor publishes them."""
    return [StreamEntry("", *contracts.encode(event)) for event in closing_events(run)]


async def _replay(run_id: uuid.UUID, last_id: str, until: str) -> AsyncGenerator[bytes, None]:
    """A finished run's entries after ``last_id`` up to ``until``, read in pages, then (without
    an ``end`` among them) its closing events from its row."""
    client = redis_client.shared_async(settings.REDIS_URL)
    last_type = None
    async with aclosing(entry_pages(client, contracts.run_stream_key(run_id), last_id, until)) as pages:
        async for entries in pages:
            for entry in entries:
                yield _sse(entry)
            last_type = entries[-1].type
    if last_type != contracts.END:
        run = await db_call(Run.objects.get, pk=run_id)
        for entry in _closing_events(run):
            yield _sse(entry)


async def _leased(
    lease: stream_leases.Lease,
    events: AsyncGenerator[bytes, None],
    slot: replay_memory.Slot | None = None,
    stall_s: float | None = None,
) -> AsyncGenerator[bytes, None]:
    """``events``, giving the tenant's stream slot (and a replay's memory ``slot``) back when
    they end or the client leaves, or, with ``stall_s``, when the client has not taken the last
    event for that long.

    Generators are closed explicitly (``aclosing``): when the client leaves, Django closes only
    the outermost one, and an inner one left open would keep its Redis connection until the
    garbage collector found it.

    Why ``stall_s``: a client that stops reading leaves the server's send waiting for good, and
    the replay with it, holding its page, its replay memory and its lease while the connection
    stays open. A watchdog task gives both slots back itself (the sending task, once cancelled,
    cannot be relied on to reach Redis) and cancels the task sending the response: Django then
    closes the generators, freeing the page, and the server closes the connection."""
    loop = asyncio.get_running_loop()
    sender = asyncio.current_task()
    waiting_since: list[float | None] = [None]

    async def watch(stall: float) -> None:
        while True:
            await asyncio.sleep(stall / 4)
            since = waiting_since[0]
            if since is not None and loop.time() - since > stall:
                log.info("event=replay_stalled account=%s stall_s=%g", lease.account, stall)
                if slot is not None:
                    slot.release()
                await lease.release()
                if sender is not None:
                    sender.cancel()
                return

    lease.keep_alive()
    if slot is not None:
        slot.started()
    watchdog = None if stall_s is None else asyncio.create_task(watch(stall_s))
    try:
        async with aclosing(events):
            async for chunk in events:
                waiting_since[0] = loop.time()
                yield chunk
                waiting_since[0] = None
    finally:
        if watchdog is not None:
            watchdog.cancel()
        if slot is not None:
            slot.release()
        await lease.release()


def sse_response(chunks: AsyncIterator[bytes]) -> StreamingHttpResponse:
    """A server-sent event stream that neither caches nor proxies (nginx) may buffer; the run
    events here and the OpenAI endpoints' streams share it."""
    response = StreamingHttpResponse(chunks, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


def _throttled_stream(refused: stream_leases.StreamLimitReached) -> JsonResponse:
    response = _error(429, "throttled", str(refused))
    response["Retry-After"] = str(refused.retry_after)
    return response


async def run_events(request: HttpRequest, run_id: uuid.UUID):
    try:
        admitted = await db_call(_admit, request, run_id)
    except _Refused as refused:
        return refused.response()
    last_id = request.headers.get("Last-Event-ID") or request.GET.get("last_event_id") or "0-0"
    try:
        parse_event_id(last_id)
    except ValueError as exc:
        return _error(400, "invalid", str(exc))
    try:
        lease = await stream_leases.acquire(admitted.account, admitted.stream_cap)
    except stream_leases.StreamLimitReached as refused:
        return _throttled_stream(refused)
    slot = None
    try:
        if admitted.run_status in Run.TERMINAL:
            had_end, until = await finished_end(run_id, last_id)
            if had_end:
                await lease.release()
                return HttpResponse(status=204)  # had the end already; EventSource stops on 204
            slot = replay_memory.take(admitted.account)
            events = _replay(run_id, last_id, until)
        else:
            events = _stream(run_id, last_id)
    except replay_memory.ReplayMemoryFull as full:
        await lease.release()
        response = JsonResponse(
            {"error": {"code": "throttled", "message": str(full), "detail": {"retry_after": full.retry_after}}},
            status=429,
        )
        response["Retry-After"] = str(full.retry_after)
        return response
    except BaseException:
        if slot is not None:
            slot.release()
        await lease.release()
        raise
    stall_s = None if slot is None else settings.SYMPHONY_REPLAY_STALL_S
    return sse_response(_leased(lease, events, slot, stall_s))
