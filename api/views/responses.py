"""``/v1/responses`` (OpenAI's Responses API): create, retrieve, delete, cancel.

Async views like the chat endpoint's (api/views/openai.py, whose key check, concurrency queue,
stream slots and disconnect handling they share): a response is a run of the built-in LIP,
mapped by api/services/responses.py. A streamed response sends the Responses API's typed
server-sent events (``response.created`` ... ``response.completed``) as the run's messages
arrive; a ``background`` one answers at once and is settled when retrieved.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
from collections.abc import AsyncGenerator
from contextlib import aclosing

from django.conf import settings
from django.core.exceptions import ObjectDoesNotExist, RequestDataTooBig
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from api import parsers
from api.asyncdb import db_call, db_call_before_next
from api.models import ApiKey, Run, StoredResponse
from api.serializers.responses import ResponseCreateSerializer
from api.services import responses, run_handoff, run_notices, server_errors, stream_leases
from api.services.openai_requests import error_body
from api.services.quotas import ConcurrencyLimitReached, PlanLimits, PlanQuotaExceeded
from api.services.responses import Turn
from api.throttling import noted_tokens_used
from api.views.openai import _abandon, _allow, _first_try_only, _key, _key_and_plan, _Refused, _start_leased
from api.views.run_events import run_ended, run_messages, sse_response
from web.body_limit import too_large_body

log = logging.getLogger(__name__)


def _prepare(request: HttpRequest) -> tuple[ApiKey, Turn, PlanLimits]:
    """The caller's key, its prepared turn and its tenant's plan, read once for the request."""
    key, plan = _key_and_plan(request)
    try:
        data = parsers.loads(request.body or b"{}")
    except RequestDataTooBig:
        raise _Refused(413, too_large_body(request.path, settings.SYMPHONY_MAX_REQUEST_BYTES)) from None
    except ValueError as exc:
        raise _Refused(400, error_body(f"request body is not valid JSON: {exc}", "invalid_request_error")) from None
    serializer = ResponseCreateSerializer(data=data)
    if not serializer.is_valid():
        field, problems = next(iter(serializer.errors.items()))
        raise _Refused(400, error_body(f"{field}: {json.dumps(problems)}", "invalid_request_error", param=field))
    try:
        turn = responses.prepare(key.tenant, serializer)
    except responses.NotFound as missing:
        raise _Refused(404, responses.not_found_body(str(missing))) from None
    except responses.Refused as refused:
        raise _Refused(400, refused.body) from None
    if turn.completion is not None:
        turn.completion = dataclasses.replace(turn.completion, traceparent=request.headers.get("traceparent", ""))
    return key, turn, plan


def _start_once(key: ApiKey, turn: Turn, plan: PlanLimits, tokens_used: int | None = None) -> Turn | None:
    try:
        return responses.start(key.tenant, key, turn, plan, tokens_used)
    except ConcurrencyLimitReached:
        return None
    except PlanQuotaExceeded as exc:
        raise _Refused(429, error_body(str(exc), "insufficient_quota", "quota_exceeded")) from None


async def _start(key: ApiKey, turn: Turn, plan: PlanLimits, tokens_used: int | None = None) -> Turn:
    """As the chat endpoint: over the plan's concurrent-run limit, wait a bounded time on the
    tenant's ended-run notices (api/services/run_notices.py), trying again once per run that
    ended, never polling the database. ``tokens_used``: the month's tokens as the request's
    token headers read them, checked by its first try only."""
    month = _first_try_only(tokens_used)
    started = await run_notices.start_when_a_slot_frees(
        key.tenant_id, lambda: db_call(_start_once, key, turn, plan, month()), settings.SYMPHONY_OPENAI_QUEUE_S
    )
    if started is None:
        message = "this API key's tenant already runs as many requests as its plan allows: retry later"
        raise _Refused(429, error_body(message, "rate_limit_error", "rate_limit_exceeded"), {"Retry-After": "1"})
    return started


def _ended_run(turn: Turn) -> tuple[Run, int]:
    """The turn's run as recorded once its ``end`` event was seen and its usage row's metered
    ``cached_tokens`` (0 without one): handed over by this process's executor when it ran here
    (api/services/run_handoff.py), else read in one statement."""
    assert turn.run is not None
    run = run_handoff.take(turn.run.pk) or Run.objects.select_related("usage").get(pk=turn.run.pk)
    try:
        return run, int(run.usage.cached_tokens)
    except ObjectDoesNotExist:  # ended without a usage row
        return run, 0


def _finish(turn: Turn) -> tuple[int, dict]:
    """The status and body of a turn whose run ended (stored turns are settled first)."""
    run, metered = _ended_run(turn)
    if run.status in ("failed", "timed_out"):
        if turn.row is not None:
            responses.settle(turn.row, run, metered)
        message, request_id = server_errors.run_failure(run)
        return 408 if run.status == "timed_out" else 500, error_body(message, "server_error", request_id=request_id)
    result = responses.outcome(run, metered)
    if result["status"] == "failed":  # the LIP refused the request: the client's input is at fault
        if turn.row is not None:
            responses.settle(turn.row, run, metered)
        error = result["error"]
        return 400, error_body(error["message"], "invalid_request_error", error["code"], param=error.get("param"))
    if turn.row is not None:
        return 200, responses.body(responses.settle(turn.row, run, metered))
    return 200, responses.body(turn, run, metered=metered)


async def _wait(run: Run) -> None:
    await run_ended(run.pk)


@csrf_exempt
@_allow("POST")
async def create(request: HttpRequest):
    try:
        # Its connection serves _start's first call too (at once, or after one Redis call).
        key, turn, plan = await db_call_before_next(_prepare, request)
    except _Refused as refused:
        return refused.response()
    if turn.background:
        try:
            turn = await _start(key, turn, plan, noted_tokens_used(request))
        except _Refused as refused:
            return refused.response()
        assert turn.run is not None
        response = JsonResponse(responses.body(turn, status="queued"))
        response["X-Symphony-Run-Id"] = str(turn.run.pk)
        return response
    start = functools.partial(_start, key, turn, plan, noted_tokens_used(request))
    started = await _start_leased(key.tenant.account_key, plan.max_concurrent_streams, start)
    if isinstance(started, JsonResponse):
        return started
    lease, turn = started
    assert turn.run is not None
    run = turn.run
    if turn.stream:
        response = sse_response(_events(turn, lease))
    else:
        lease.keep_alive()
        try:
            await _wait(run)
        except asyncio.CancelledError:
            await _abandon(run)
            raise
        finally:
            await lease.release()
        status, body = await db_call(_finish, turn)
        response = JsonResponse(body, status=status)
    response["X-Symphony-Run-Id"] = str(run.pk)
    return response


class _Events:
    """The Responses API's server-sent events of one streamed turn, numbered in order."""

    def __init__(self, turn: Turn) -> None:
        assert turn.run is not None
        self.turn, self.run = turn, turn.run
        self.sequence = 0
        self.index = 0  # the next output item's position
        self.text: str | None = None  # the open message's text so far (None: none open)
        self.held = ""  # leading whitespace not sent yet (see ``holds_space``)
        #: With tools offered, a message opens with real text: whitespace before a tool call is
        #: no message (as the settled response has none). Without tools every answer is a message,
        #: so its first delta is sent at once (a held one would delay the first token).
        self.holds_space = bool(turn.completion is not None and turn.completion.args.get("tools"))
        self.message_index = 0

    def event(self, kind: str, **payload: object) -> bytes:
        payload = {"type": kind, "sequence_number": self.sequence, **payload}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(payload)}\n\n".encode()

    def opening(self) -> list[bytes]:
        body = responses.body(self.turn, status="in_progress")
        return [self.event("response.created", response=body), self.event("response.in_progress", response=body)]

    def _open_message(self) -> list[bytes]:
        item_id = f"msg_{self.run.pk.hex}"
        self.message_index, self.index, self.text = self.index, self.index + 1, ""
        part = {"type": "output_text", "text": "", "annotations": []}
        return [
            self.event(
                "response.output_item.added",
                output_index=self.message_index,
                item=responses.message_item(self.run, None, "in_progress"),
            ),
            self.event(
                "response.content_part.added",
                item_id=item_id,
                output_index=self.message_index,
                content_index=0,
                part=part,
            ),
        ]

    def delta(self, text: str) -> list[bytes]:
        out: list[bytes] = []
        if not text:
            return out
        if self.text is None:
            self.held += text
            if self.holds_space and not self.held.strip():
                return out
            out += self._open_message()
            text, self.held = self.held, ""
        assert self.text is not None
        self.text += text
        out.append(
            self.event(
                "response.output_text.delta",
                item_id=f"msg_{self.run.pk.hex}",
                output_index=self.message_index,
                content_index=0,
                delta=text,
                logprobs=[],
            )
        )
        return out

    def close_message(self, final: str | None = None, status: str = "completed") -> list[bytes]:
        if self.text is None:
            return []
        text = self.text if final is None else final
        item_id = f"msg_{self.run.pk.hex}"
        part = {"type": "output_text", "text": text, "annotations": []}
        out = [
            self.event(
                "response.output_text.done",
                item_id=item_id,
                output_index=self.message_index,
                content_index=0,
                text=text,
                logprobs=[],
            ),
            self.event(
                "response.content_part.done",
                item_id=item_id,
                output_index=self.message_index,
                content_index=0,
                part=part,
            ),
            self.event(
                "response.output_item.done",
                output_index=self.message_index,
                item=responses.message_item(self.run, text, status),
            ),
        ]
        self.text = None
        return out

    def call(self, call: dict) -> list[bytes]:
        out = self.close_message()
        index, self.index = self.index, self.index + 1
        item_id = f"fc_{self.run.pk.hex}_{call['index']}"
        out.append(
            self.event("response.output_item.added", output_index=index, item=responses.call_item(self.run, call, ""))
        )
        out.append(
            self.event(
                "response.function_call_arguments.delta", item_id=item_id, output_index=index, delta=call["arguments"]
            )
        )
        out.append(
            self.event(
                "response.function_call_arguments.done",
                item_id=item_id,
                output_index=index,
                name=call["name"],
                arguments=call["arguments"],
            )
        )
        out.append(
            self.event("response.output_item.done", output_index=index, item=responses.call_item(self.run, call))
        )
        return out

    def closing(self, body: dict) -> list[bytes]:
        """The last events, from the settled response ``body``."""
        if body["status"] == "failed" or body["status"] == "cancelled":
            return [self.event("response.failed", response=body)]
        out: list[bytes] = []
        messages = [item for item in body["output"] if item["type"] == "message"]
        if messages:
            final = messages[0]["content"][0]["text"] if messages[0]["content"] else ""
            if self.text is None and self.index == 0:  # nothing streamed: an empty answer
                out += self._open_message()
            out += self.close_message(final, messages[0]["status"])
        kind = "response.incomplete" if body["status"] == "incomplete" else "response.completed"
        return [*out, self.event(kind, response=body)]


def _settled_body(turn: Turn) -> dict:
    run, metered = _ended_run(turn)
    if turn.row is not None:
        return responses.body(responses.settle(turn.row, run, metered))
    return responses.body(turn, run, metered=metered)


async def _events(turn: Turn, lease: stream_leases.Lease) -> AsyncGenerator[bytes, None]:
    lease.keep_alive()
    try:
        async with aclosing(_run_events(turn)) as events:
            async for event in events:
                yield event
    finally:
        await lease.release()


async def _run_events(turn: Turn) -> AsyncGenerator[bytes, None]:
    assert turn.run is not None
    events = _Events(turn)
    for event in events.opening():
        yield event
    try:
        async with aclosing(run_messages(turn.run.pk)) as messages:
            async for message in messages:
                if message is None:
                    yield b": keep-alive\n\n"
                elif "delta" in message:
                    for event in events.delta(str(message["delta"])):
                        yield event
                elif isinstance(message.get("tool_call"), dict):
                    for event in events.call(message["tool_call"]):
                        yield event
    except (asyncio.CancelledError, GeneratorExit):
        await _abandon(turn.run)
        raise
    body = await db_call(_settled_body, turn)
    for event in events.closing(body):
        yield event


def _stored(request: HttpRequest, response_id: str, action) -> JsonResponse:
    key = _key(request)
    try:
        return JsonResponse(action(key.tenant, response_id))
    except responses.NotFound:
        return JsonResponse(responses.not_found_body(response_id), status=404)
    except responses.Refused as refused:
        return JsonResponse(refused.body, status=400)


async def _respond(request: HttpRequest, response_id: str, action) -> JsonResponse:
    try:
        return await db_call(_stored, request, response_id, action)
    except _Refused as refused:
        return refused.response()


@csrf_exempt
@_allow("GET", "DELETE")
async def detail(request: HttpRequest, response_id: str):
    action = responses.retrieve if request.method == "GET" else responses.delete
    return await _respond(request, response_id, action)


@csrf_exempt
@_allow("POST")
async def cancel(request: HttpRequest, response_id: str):
    return await _respond(request, response_id, responses.cancel)


def _input_items(tenant, response_id: str, query: dict[str, str]) -> dict:
    """The page OpenAI's ``input_items.list`` asks for: ``order`` (``desc``, the default, or
    ``asc``), ``limit`` (1-100, default 20), ``after`` (an item id); other query parameters are
    a 400 naming them."""
    unknown = sorted(set(query) - {"order", "limit", "after"})
    if unknown:
        message = f"unsupported query parameter {unknown[0]!r}"
        raise responses.Refused(error_body(message, "invalid_request_error", param=unknown[0]))
    order, limit = query.get("order", "desc"), query.get("limit", "20")
    if order not in ("asc", "desc") or not limit.isdigit() or not 1 <= int(limit) <= 100:
        message = "order must be asc or desc and limit an integer from 1 to 100"
        raise responses.Refused(
            error_body(message, "invalid_request_error", param="order" if order not in ("asc", "desc") else "limit")
        )
    row: StoredResponse = responses.lookup(tenant, response_id)
    items = [{"id": f"in_{row.pk.hex}_{i}", **item} for i, item in enumerate(row.input_items)]
    if order == "desc":
        items = items[::-1]
    ids = [item["id"] for item in items]
    if "after" in query:
        if query["after"] not in ids:
            raise responses.Refused(error_body("no such item to list after", "invalid_request_error", param="after"))
        items = items[ids.index(query["after"]) + 1 :]
    data = items[: int(limit)]
    first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
    return {"object": "list", "data": data, "first_id": first, "last_id": last, "has_more": len(items) > len(data)}


@csrf_exempt
@_allow("GET")
async def input_items(request: HttpRequest, response_id: str):
    """This turn's own input items (not those of the turns it continues)."""
    query = {key: request.GET[key] for key in request.GET}
    return await _respond(request, response_id, lambda tenant, rid: _input_items(tenant, rid, query))
