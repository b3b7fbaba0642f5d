"""``/v1/chat/completions``, ``/v1/completions`` and ``/v1/models`` for OpenAI clients.

Async Django views (served by the ASGI app): a request becomes a run of the built-in LIP
(api/services/openai_requests.py); the response waits on the run's Redis stream, so a streaming
client receives each token as the worker publishes it and nothing holds a thread meanwhile.
Authentication is an API key with the ``runs`` scope; errors use OpenAI's error envelope.
Like the run events endpoint, a request waiting on its run holds no database connection
(api/asyncdb.py) and one of its tenant's stream slots (api/services/stream_leases.py), taken
before the run is created: past the cap a 429 ``rate_limit_exceeded`` and no run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from typing import Any, TypeVar

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from api import parsers
from api.asyncdb import db_call, db_call_before_next
from api.authentication import KeyRefused, bearer_key
from api.models import ApiKey, Run
from api.serializers.openai import ChatCompletionSerializer, CompletionSerializer
from api.services import openai_requests, run_handoff, run_notices, server_errors, stream_leases
from api.services.openai_requests import (
    CompletionRequest,
    chunk_body,
    completion_body,
    error_body,
    refusal,
    refusal_status,
    usage_chunk,
)
from api.services.quotas import ConcurrencyLimitReached, PlanLimits, PlanQuotaExceeded, plan_limits
from api.throttling import TenantThrottled, check_tenant_rate, note_token_allowance, noted_tokens_used
from api.views.run_events import run_ended, run_messages, sse_response
from web.body_limit import too_large_body

log = logging.getLogger(__name__)
_Started = TypeVar("_Started")


class _Refused(Exception):
    def __init__(self, status: int, body: dict, headers: dict[str, str] | None = None) -> None:
        self.status = status
        self.body = body
        self.headers = headers or {}

    def response(self) -> JsonResponse:
        return JsonResponse(self.body, status=self.status, headers=self.headers)


def _key(request: HttpRequest) -> ApiKey:
    return _key_and_plan(request)[0]


def _key_and_plan(request: HttpRequest) -> tuple[ApiKey, PlanLimits]:
    """The caller's key, checked (scope, its tenant's request rate), and its tenant's plan, read
    once for the whole request (rate, stream cap, token limit, the concurrency check): each read
    is a query on the path of every answer."""
    try:
        key = bearer_key(request)
    except KeyRefused as refused:
        if refused.status == 429:
            body = error_body(refused.message, "rate_limit_error", "rate_limit_exceeded")
            raise _Refused(429, body, {"Retry-After": str(refused.retry_after)}) from None
        raise _Refused(401, error_body(refused.message, "invalid_request_error", "invalid_api_key")) from None
    if key is None:
        message = "an API key is required: Authorization: Bearer sk_..."
        raise _Refused(401, error_body(message, "invalid_request_error", "invalid_api_key"))
    if "runs" not in key.scopes:
        raise _Refused(403, error_body("this API key lacks the 'runs' scope", "invalid_request_error"))
    plan = plan_limits(key.tenant)
    try:
        check_tenant_rate(key.tenant, request, plan)
    except TenantThrottled as throttled:
        body = error_body(str(throttled), "rate_limit_error", "rate_limit_exceeded")
        raise _Refused(429, body, {"Retry-After": str(throttled.retry_after)}) from None
    note_token_allowance(key.tenant, request, plan)
    return key, plan


def _parse(request: HttpRequest, serializer_class: type) -> CompletionRequest:
    try:
        body = parsers.loads(request.body or b"{}")  # the REST API's parser (api/parsers.py)
    except RequestDataTooBig:  # only without web/body_limit.py in front (another server)
        limit = settings.SYMPHONY_MAX_REQUEST_BYTES
        raise _Refused(413, too_large_body(request.path, limit)) from None
    except ValueError as exc:
        message = f"request body is not valid JSON: {exc}"
        raise _Refused(400, error_body(message, "invalid_request_error")) from None
    serializer = serializer_class(data=body)
    if not serializer.is_valid():
        field, problems = next(iter(serializer.errors.items()))
        raise _Refused(400, error_body(f"{field}: {json.dumps(problems)}", "invalid_request_error", param=field))
    return dataclasses.replace(serializer.to_completion_request(), traceparent=request.headers.get("traceparent", ""))


def _admit(request: HttpRequest, serializer_class: type) -> tuple[ApiKey, CompletionRequest, PlanLimits]:
    """The caller's key, its validated request and its tenant's plan (:func:`_key_and_plan`)."""
    key, plan = _key_and_plan(request)
    return key, _parse(request, serializer_class), plan


def _start_once(key: ApiKey, parsed: CompletionRequest, plan: PlanLimits, tokens_used: int | None = None) -> Run | None:
    """The run, or ``None`` while the tenant is at its concurrent-run limit. ``tokens_used``:
    the month's tokens as the request's token headers read them (:func:`_first_try_only`)."""
    try:
        return openai_requests.start(key.tenant, key, parsed, plan, tokens_used)
    except ConcurrencyLimitReached:
        return None
    except PlanQuotaExceeded as exc:
        raise _Refused(429, error_body(str(exc), "insufficient_quota", "quota_exceeded")) from None


def _first_try_only(tokens_used: int | None) -> Callable[[], int | None]:
    """``tokens_used`` (the month's tokens the request's token headers read) for its first
    creation attempt, then ``None``: a try after waiting for a slot comes after runs ended and
    used tokens, so its check reads the month's tokens afresh."""
    figures = iter([tokens_used])
    return lambda: next(figures, None)


async def _start(key: ApiKey, parsed: CompletionRequest, plan: PlanLimits, tokens_used: int | None = None) -> Run:
    """Start the run; over the plan's concurrent-run limit the request waits (holding no
    database connection) up to ``SYMPHONY_OPENAI_QUEUE_S`` for a run of its tenant to end, as
    a serving system queues a burst, then gets a 429 with ``Retry-After``. It waits on the
    tenant's ended-run notices (api/services/run_notices.py), trying again once per run that
    ended (and once at its deadline), never polling the database. ``tokens_used``: the month's
    tokens as the request's token headers read them, checked by its first try."""
    month = _first_try_only(tokens_used)
    run = await run_notices.start_when_a_slot_frees(
        key.tenant_id, lambda: db_call(_start_once, key, parsed, plan, month()), settings.SYMPHONY_OPENAI_QUEUE_S
    )
    if run is None:
        message = (
            "this API key's tenant already runs as many requests as its plan allows, still after "
            f"waiting {settings.SYMPHONY_OPENAI_QUEUE_S:g} s: retry later"
        )
        raise _Refused(429, error_body(message, "rate_limit_error", "rate_limit_exceeded"), {"Retry-After": "1"})
    return run


async def _finished_run(run: Run) -> Run:
    await run_ended(run.pk)
    return await _recorded(run)


async def _recorded(run: Run) -> Run:
    """The run as recorded once its ``end`` event was seen: handed over by this process's
    executor when it ran here (api/services/run_handoff.py), else read from the database."""
    done = run_handoff.take(run.pk)
    return done if done is not None else await db_call(Run.objects.select_related("usage").get, pk=run.pk)


def _failure_body(run: Run) -> dict:
    """The error a client of a failed or timed-out run sees: no error text of the run (the
    built-in program's carries its frames and server paths), a request id its cause is logged
    under."""
    message, request_id = server_errors.run_failure(run)
    return error_body(message, "server_error", request_id=request_id)


def _failure(run: Run) -> JsonResponse:
    return JsonResponse(_failure_body(run), status=408 if run.status == "timed_out" else 500)


async def _abandon(run: Run) -> None:
    """The client disconnected before the answer was complete (Django cancels the view, or
    closes the streaming generator): stop the run instead of generating for nobody."""
    try:
        await db_call(openai_requests.abandon, run.pk)
    except Exception:  # the disconnect is being handled: log, never mask it
        log.exception("openai_abandon_failed run=%s", run.pk)


async def _chunks(parsed: CompletionRequest, run: Run, lease: stream_leases.Lease) -> AsyncGenerator[bytes, None]:
    lease.keep_alive()
    try:
        async with aclosing(_run_chunks(parsed, run)) as chunks:
            async for chunk in chunks:
                yield chunk
    finally:
        await lease.release()


async def _run_chunks(parsed: CompletionRequest, run: Run) -> AsyncGenerator[bytes, None]:
    def sse(body: dict) -> bytes:
        return f"data: {json.dumps(body)}\n\n".encode()

    try:
        async with aclosing(run_messages(run.pk)) as messages:
            async for message in messages:
                if message is None:
                    yield b": keep-alive\n\n"
                    continue
                index = int(message.get("index", 0))
                if "delta" in message:
                    logprobs = message.get("logprobs") if isinstance(message.get("logprobs"), list) else None
                    yield sse(chunk_body(parsed, run, index, str(message["delta"]), None, logprobs))
                elif isinstance(message.get("tool_call"), dict):
                    yield sse(chunk_body(parsed, run, index, None, None, tool_call=message["tool_call"]))
    except (asyncio.CancelledError, GeneratorExit):
        await _abandon(run)
        raise
    done = await _recorded(run)
    if done.status != "succeeded":
        yield sse(_failure_body(done))
        return
    refused = refusal(parsed, done)
    if refused is not None:
        yield sse(refused)
        return
    result: dict[str, Any] = done.result or {}
    for choice in result.get("choices", []):
        yield sse(chunk_body(parsed, done, choice["index"], None, choice["finish_reason"]))
    if parsed.include_usage:
        yield sse(usage_chunk(parsed, done))
    yield b"data: [DONE]\n\n"


def _stream_limit_reached(refused: stream_leases.StreamLimitReached) -> JsonResponse:
    """The tenant holds as many open streams as its plan allows: OpenAI's 429, with when to retry."""
    body = error_body(str(refused), "rate_limit_error", "rate_limit_exceeded")
    return JsonResponse(body, status=429, headers={"Retry-After": str(refused.retry_after)})


async def _start_leased(
    account: str, cap: int, start: Callable[[], Awaitable[_Started]]
) -> tuple[stream_leases.Lease, _Started] | JsonResponse:
    """One of the account's stream slots, then ``start()``; the slot goes back if the start fails.
    A request waits on its run through a stream whether or not its client streams, so every
    /v1 request that starts a run holds a slot. A refusal (no slot: 429; the start's own) is
    returned as the response to send."""
    try:
        lease = await stream_leases.acquire(account, cap)
    except stream_leases.StreamLimitReached as refused:
        return _stream_limit_reached(refused)
    try:
        return lease, await start()
    except BaseException as exc:
        await lease.release()
        if isinstance(exc, _Refused):
            return exc.response()
        raise


async def _complete(request: HttpRequest, serializer_class: type):
    try:
        # Its connection serves _start's first call too (the stream lease between is one Redis call).
        key, parsed, plan = await db_call_before_next(_admit, request, serializer_class)
    except _Refused as refused:
        return refused.response()
    start = functools.partial(_start, key, parsed, plan, noted_tokens_used(request))
    started = await _start_leased(key.tenant.account_key, plan.max_concurrent_streams, start)
    if isinstance(started, JsonResponse):
        return started
    lease, run = started
    if parsed.stream:
        response = sse_response(_chunks(parsed, run, lease))
    else:
        lease.keep_alive()
        try:
            done = await _finished_run(run)
        except asyncio.CancelledError:
            await _abandon(run)
            raise
        finally:
            await lease.release()
        if done.status != "succeeded":
            return _failure(done)
        refused_body = refusal(parsed, done)
        if refused_body:
            response = JsonResponse(refused_body, status=refusal_status(refused_body))
        else:
            response = JsonResponse(completion_body(parsed, done))
    response["X-Symphony-Run-Id"] = str(run.pk)
    return response


def _allow(*methods: str) -> Callable:
    """Like Django's ``require_http_methods``, but the 405 is OpenAI's JSON error envelope."""

    def decorate(view: Callable) -> Callable:
        @functools.wraps(view)
        async def wrapped(request: HttpRequest, *args: object, **kwargs: object):
            if request.method not in methods:
                message = f"{request.method} is not allowed on {request.path}; use {', '.join(methods)}"
                body = error_body(message, "invalid_request_error", "method_not_allowed")
                return JsonResponse(body, status=405, headers={"Allow": ", ".join(methods)})
            return await view(request, *args, **kwargs)

        return wrapped

    return decorate


@csrf_exempt
@_allow("POST")
async def chat_completions(request: HttpRequest):
    return await _complete(request, ChatCompletionSerializer)


@csrf_exempt
@_allow("POST")
async def completions(request: HttpRequest):
    return await _complete(request, CompletionSerializer)


def _model_object() -> dict:
    return {"id": openai_requests.model_name(), "object": "model", "created": 0, "owned_by": "symphony"}


@csrf_exempt
@_allow("GET")
async def models(request: HttpRequest):
    try:
        await db_call(_key, request)
    except _Refused as refused:
        return refused.response()
    return JsonResponse({"object": "list", "data": [_model_object()]})


@csrf_exempt
@_allow("GET")
async def model(request: HttpRequest, model_id: str):
    """``/v1/models/<id>``: the served model by its name, else OpenAI's ``model_not_found``."""
    try:
        await db_call(_key, request)
    except _Refused as refused:
        return refused.response()
    if model_id != openai_requests.model_name():
        message = f"The model '{model_id}' does not exist; this deployment serves '{openai_requests.model_name()}'"
        return JsonResponse(error_body(message, "invalid_request_error", "model_not_found", "model"), status=404)
    return JsonResponse(_model_object())


@csrf_exempt
async def unsupported(request: HttpRequest, what: str):
    """An OpenAI endpoint this deployment does not serve (it has one generative model)."""
    body = error_body(f"{what} are not supported by this deployment", "invalid_request_error", "unsupported_endpoint")
    return JsonResponse(body, status=404)


@csrf_exempt
async def not_found(request: HttpRequest, rest: str = ""):
    """Any other ``/v1/`` path: OpenAI's JSON 404 (whatever DEBUG says), never an HTML page."""
    body = error_body(f"no route {request.method} {request.path}", "invalid_request_error", "not_found")
    return JsonResponse(body, status=404)
