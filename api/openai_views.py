"""``/v1/chat/completions``, ``/v1/completions`` and ``/v1/models`` for OpenAI clients.

Async Django views (served by the ASGI app): a request becomes a run of the built-in LIP
(api/services/openai_compat.py); the response waits on the run's Redis stream, so a streaming
client receives each token as the worker publishes it and nothing holds a thread meanwhile.
Authentication is an API key with the ``runs`` scope; errors use OpenAI's error envelope.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator

from asgiref.sync import sync_to_async
from django.http import HttpRequest, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from api import parsers
from api.authentication import KeyRefused, bearer_key
from api.events import stream_entries
from api.models import ApiKey, Run
from api.openai_serializers import ChatCompletionSerializer, CompletionSerializer
from api.services import openai_compat
from api.services.openai_compat import CompletionRequest, chunk_body, completion_body, error_body, usage_chunk
from api.services.quotas import QuotaExceeded
from api.throttling import TenantThrottled, check_tenant_rate

log = logging.getLogger(__name__)


class _Refused(Exception):
    def __init__(self, status: int, body: dict, headers: dict[str, str] | None = None) -> None:
        self.status = status
        self.body = body
        self.headers = headers or {}

    def response(self) -> JsonResponse:
        return JsonResponse(self.body, status=self.status, headers=self.headers)


def _key(request: HttpRequest) -> ApiKey:
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
    try:
        check_tenant_rate(key.tenant, request)
    except TenantThrottled as throttled:
        body = error_body(str(throttled), "rate_limit_error", "rate_limit_exceeded")
        raise _Refused(429, body, {"Retry-After": str(throttled.retry_after)}) from None
    return key


def _parse(request: HttpRequest, serializer_class: type) -> CompletionRequest:
    try:
        body = parsers.loads(request.body or b"{}")  # the REST API's parser (api/parsers.py)
    except ValueError as exc:
        message = f"request body is not valid JSON: {exc}"
        raise _Refused(400, error_body(message, "invalid_request_error")) from None
    serializer = serializer_class(data=body)
    if not serializer.is_valid():
        field, problems = next(iter(serializer.errors.items()))
        raise _Refused(400, error_body(f"{field}: {json.dumps(problems)}", "invalid_request_error"))
    return serializer.to_completion_request()


def _start(request: HttpRequest, serializer_class: type) -> tuple[CompletionRequest, Run]:
    key = _key(request)
    parsed = _parse(request, serializer_class)
    try:
        return parsed, openai_compat.start(key.tenant, key, parsed)
    except QuotaExceeded as exc:
        raise _Refused(429, error_body(str(exc), "insufficient_quota", "quota_exceeded")) from None


async def _finished_run(run: Run) -> Run:
    async for entry in stream_entries(run.pk):
        if entry.type == "end":
            break
    return await Run.objects.aget(pk=run.pk)


def _failure(run: Run) -> JsonResponse:
    status = 408 if run.status == "timed_out" else 500
    return JsonResponse(error_body(f"run {run.pk} {run.status}: {run.error[:2000]}", "server_error"), status=status)


async def _abandon(run: Run) -> None:
    """The client disconnected before the answer was complete (Django cancels the view, or
    closes the streaming generator): stop the run instead of generating for nobody."""
    try:
        await sync_to_async(openai_compat.abandon)(run.pk)
    except Exception:  # the disconnect is being handled: log, never mask it
        log.exception("openai_abandon_failed run=%s", run.pk)


async def _chunks(parsed: CompletionRequest, run: Run) -> AsyncIterator[bytes]:
    def sse(body: dict) -> bytes:
        return f"data: {json.dumps(body)}\n\n".encode()

    try:
        async for entry in stream_entries(run.pk):
            if entry.type is None:
                yield b": keep-alive\n\n"
            elif entry.type == "message":
                message = json.loads(entry.data).get("data") or {}
                if isinstance(message, dict) and "delta" in message:
                    yield sse(chunk_body(parsed, run, int(message.get("index", 0)), str(message["delta"]), None))
            elif entry.type == "end":
                break
    except (asyncio.CancelledError, GeneratorExit):
        await _abandon(run)
        raise
    done = await Run.objects.aget(pk=run.pk)
    if done.status != "succeeded":
        yield sse(error_body(f"run {done.pk} {done.status}: {done.error[:2000]}", "server_error"))
        return
    for choice in (done.result or {}).get("choices", []):
        yield sse(chunk_body(parsed, done, choice["index"], None, choice["finish_reason"]))
    if parsed.include_usage:
        yield sse(usage_chunk(parsed, done))
    yield b"data: [DONE]\n\n"


async def _complete(request: HttpRequest, serializer_class: type):
    try:
        parsed, run = await sync_to_async(_start)(request, serializer_class)
    except _Refused as refused:
        return refused.response()
    if parsed.stream:
        response = StreamingHttpResponse(_chunks(parsed, run), content_type="text/event-stream")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"
    else:
        try:
            done = await _finished_run(run)
        except asyncio.CancelledError:
            await _abandon(run)
            raise
        if done.status != "succeeded":
            return _failure(done)
        response = JsonResponse(completion_body(parsed, done))
    response["X-Symphony-Run-Id"] = str(run.pk)
    return response


@csrf_exempt
@require_POST
async def chat_completions(request: HttpRequest):
    return await _complete(request, ChatCompletionSerializer)


@csrf_exempt
@require_POST
async def completions(request: HttpRequest):
    return await _complete(request, CompletionSerializer)


@require_GET
async def models(request: HttpRequest):
    try:
        await sync_to_async(_key)(request)
    except _Refused as refused:
        return refused.response()
    name = openai_compat.model_name()
    return JsonResponse({"object": "list", "data": [{"id": name, "object": "model", "owned_by": "symphony"}]})
