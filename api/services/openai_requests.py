"""OpenAI-compatible completions served by a built-in LIP through the ordinary run path.

A request becomes a run of the tenant's ``openai-compat`` program (created on first use and
re-versioned when the built-in source changes), so quotas, sandboxing, batching and billing are
exactly those of any other run. This module owns the mapping both ways: request -> LIP args,
LIP result / stream messages -> OpenAI response objects and chunks.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import ObjectDoesNotExist
from django.db import transaction

from api.compiled_queries import CompiledQuery
from api.models import ApiKey, Program, ProgramVersion, Run, Tenant
from api.services import programs, trusted_runs
from api.services.quotas import PlanLimits, plan_limits
from api.services.runs import RunConflict, cancel_run, create_run

log = logging.getLogger(__name__)

BUILTIN_PROGRAM = "openai-compat"
BUILTIN_SOURCE = trusted_runs.BUILTIN_SOURCE


@dataclass(frozen=True)
class CompletionRequest:
    """A validated request of either endpoint (``chat`` tells which)."""

    chat: bool
    args: dict
    stream: bool
    model: str
    #: Worker-side token limit of the run: prompt and completion together, with headroom.
    run_max_tokens: int
    #: ``stream_options.include_usage``: a last chunk with the usage and no choices.
    include_usage: bool = False
    #: The client's W3C ``traceparent`` header as sent ("" when none): kept with the run when
    #: valid (api/services/trace_context.py), never a reason to refuse the request.
    traceparent: str = ""


def model_name() -> str:
    return settings.SYMPHONY_MODEL_NAME


def builtin_program(tenant: Tenant) -> Program:
    """The tenant's built-in program, with the current built-in source as its latest version."""
    return builtin_version(tenant).program


#: The latest version of a tenant's built-in program with its program (not its bytes: the
#: in-process path runs the file), by the tenant's id: read by every /v1 request, so compiled
#: once a process (api/compiled_queries.py).
LATEST_BUILTIN: CompiledQuery[ProgramVersion] = CompiledQuery(
    lambda tenant_id: (
        ProgramVersion.objects.select_related("program")
        .defer("content")
        .filter(program__tenant_id=tenant_id, program__name=BUILTIN_PROGRAM)
        .order_by("-number")[:1]
    ),
    markers=(-7_000_000_001,),
)


def builtin_version(tenant: Tenant) -> ProgramVersion:
    """The latest version of the tenant's built-in program (with its program), made the current
    built-in source first when it is not.

    Every /v1 request asks this, and nearly always the program and its version are already
    current: one read of the latest version joined with its program says so (the run is created
    from that row), without the row lock and transaction that creating or re-versioning takes
    (taken only then). The program's bytes are not read: the in-process path runs the file."""
    source, digest = trusted_runs.builtin_source()
    current = LATEST_BUILTIN.first(tenant.pk)
    if current is not None and current.sha256 == digest:
        return current
    with transaction.atomic():
        program, _ = Program.objects.select_for_update().get_or_create(
            tenant=tenant,
            name=BUILTIN_PROGRAM,
            defaults={"description": "Built-in LIP serving /v1/chat/completions and /v1/completions"},
        )
        latest = program.versions.order_by("-number").first()
        if latest is None or latest.sha256 != digest:
            latest = programs.add_version(program, "openai_lip.py", source)
    latest.program = program
    return latest


def start(
    tenant: Tenant,
    api_key: ApiKey | None,
    request: CompletionRequest,
    plan: PlanLimits | None = None,
    tokens_used: int | None = None,
) -> Run:
    """Create the run (quota-checked like any other); raises ``PlanQuotaExceeded``. ``plan``: the
    tenant's plan as the request read it (read here when not given). ``tokens_used``: the
    tenant's tokens this month as the request read them for its token headers, for the monthly
    check (read by the check when not given)."""
    plan = plan or plan_limits(tenant)
    version = builtin_version(tenant)
    # The worker meters the real count; the estimate only must not ask for more than the plan.
    limits = {"max_tokens": min(request.run_max_tokens, plan.max_tokens_per_run)}
    # The built-in program is ours: executed in this process when a local worker is reachable
    # (api/services/trusted_runs.py), with the same run row, quotas, events and billing, and
    # the plan this request read. With a thread taken now, the run is created running on it.
    local = trusted_runs.available()
    on_thread = local and _reserve_thread(version)
    send = None
    if on_thread:
        send = functools.partial(trusted_runs.start, plan=plan)
    elif local:
        send = functools.partial(trusted_runs.submit, plan=plan)
    try:
        run, created = create_run(
            tenant,
            version.program,
            None,
            request.args,
            limits,
            api_key=api_key,
            send=send,
            plan=plan,
            program_version=version,
            traceparent=request.traceparent,
            tokens_used=tokens_used,
            start_on=settings.SYMPHONY_WORKER_NAME if on_thread else None,
        )
    except BaseException:
        if on_thread:
            trusted_runs.release_thread()
        raise
    if on_thread and not created:
        trusted_runs.release_thread()
    return run


def _reserve_thread(version: ProgramVersion) -> bool:
    """Whether this request's run is created running on a thread of this process taken now
    (``trusted_runs.reserve_thread``). Not inside an outer transaction (a stored Responses turn
    creates its row with the run's): rolled back, it would leave the thread taken for good,
    since only the commit hands it to the run; such a run is created queued and ``submit``
    takes a thread after the commit. Only where the in-process path is available."""
    if not trusted_runs.is_builtin(version):
        return False
    if transaction.get_connection().in_atomic_block:
        return False
    return trusted_runs.reserve_thread()


def abandon(run_id: object) -> None:
    """The client of an OpenAI request went away before its answer: cancel the run, so its
    program stops and is billed only for what it did (what vLLM's server does on a disconnect).
    A run that ended meanwhile is left as it is."""
    try:
        cancel_run(Run.objects.get(pk=run_id))
    except RunConflict:
        return
    log.info("openai_request_abandoned run=%s", run_id)


def _object(request: CompletionRequest, chunk: bool) -> str:
    if request.chat:
        return "chat.completion.chunk" if chunk else "chat.completion"
    return "text_completion"


def response_id(request: CompletionRequest, run: Run) -> str:
    return f"{'chatcmpl' if request.chat else 'cmpl'}-{run.pk.hex}"


#: Refusal codes of the built-in LIP that are about the worker's load, not the request (its
#: device KV pool had no pages for the account; the account's first-time grammars are refused
#: for a back-off after one of its compiles ran past the time budget): 429, retry later, never
#: a 400.
BUSY_REFUSALS = frozenset({"kv_pool_busy", "grammar_busy"})


def refusal_status(body: dict) -> int:
    """The HTTP status of a :func:`refusal` body: 429 for the worker's load, else 400."""
    return 429 if body["error"].get("code") in BUSY_REFUSALS else 400


def refusal(request: CompletionRequest, run: Run) -> dict | None:
    """OpenAI's error body when the built-in LIP refused the request (its prompt does not fit
    the run's token budget or the model's context; the worker's KV pool had no room for the
    account now, :data:`BUSY_REFUSALS`; a schema the worker cannot compile or that
    is over its grammar budget; a token id outside the vocabulary), else ``None``."""
    result: dict[str, Any] = run.result if isinstance(run.result, dict) else {}
    invalid = result.get("invalid_request")
    if run.status == "succeeded" and isinstance(invalid, str):
        return error_body(invalid[:2000], "invalid_request_error", param="response_format")
    if run.status == "succeeded" and isinstance(invalid, dict):
        return error_body(str(invalid.get("message"))[:2000], "invalid_request_error", param=str(invalid.get("param")))
    refused = result.get("refused")
    if not isinstance(refused, dict):
        return None
    code = str(refused.get("code"))
    if code in BUSY_REFUSALS:
        return error_body(str(refused.get("message"))[:2000], "rate_limit_error", code)
    param = "messages" if request.chat else "prompt"
    return error_body(str(refused.get("message")), "invalid_request_error", code, param=param)


def _token_entry(token: str, logprob: float | None) -> dict:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8", "replace"))}


def logprobs_body(request: CompletionRequest, entries: list | None, offset: int = 0) -> dict | None:
    """The LIP's ``[token, logprob, [[alternative, logprob], ...]]`` entries in OpenAI's shape:
    chat's ``{"content": [...]}`` or completions' parallel lists (``text_offset`` counted from
    ``offset`` characters into the choice's text)."""
    if entries is None:
        return None
    if request.chat:
        content = []
        for token, logprob, top in entries:
            entry = _token_entry(token, logprob)
            entry["top_logprobs"] = [_token_entry(t, lp) for t, lp in top]
            content.append(entry)
        return {"content": content}
    tokens, offsets, position = [], [], offset
    for token, _, _ in entries:
        tokens.append(token)
        offsets.append(position)
        position += len(token)
    return {
        "tokens": tokens,
        "token_logprobs": [e[1] for e in entries],
        "top_logprobs": [None if e[1] is None else dict(e[2]) for e in entries],
        "text_offset": offsets,
    }


def tool_call_body(call: dict, streamed: bool = False) -> dict:
    """One call of the LIP's result (``index``, ``id``, ``name``, ``arguments``) as OpenAI's
    ``tool_calls`` entry (with its ``index`` when streamed)."""
    body = {"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}
    return {"index": call["index"], **body} if streamed else body


def completion_body(request: CompletionRequest, run: Run) -> dict:
    """The non-streaming response for a run that succeeded."""
    result: dict[str, Any] = run.result or {}
    choices = []
    for choice in result.get("choices", []):
        logprobs = logprobs_body(request, choice.get("logprobs"))
        entry: dict = {"index": choice["index"], "finish_reason": choice["finish_reason"], "logprobs": logprobs}
        if request.chat:
            calls = choice.get("tool_calls") or []
            message: dict = {"role": "assistant", "content": choice["text"] if choice["text"] or not calls else None}
            if calls:
                message["tool_calls"] = [tool_call_body(c) for c in calls]
            entry["message"] = message
        else:
            entry["text"] = choice["text"]
        choices.append(entry)
    return {
        "id": response_id(request, run),
        "object": _object(request, chunk=False),
        "created": int(run.created_at.timestamp()),
        "model": request.model,
        "choices": choices,
        "usage": usage_body(run),
    }


def chunk_body(
    request: CompletionRequest,
    run: Run,
    index: int,
    text: str | None,
    finish: str | None,
    logprobs: list | None = None,
    tool_call: dict | None = None,
) -> dict:
    """One streaming chunk: a text delta of choice ``index`` (with its tokens' logprobs when
    asked), one of its tool calls (whole: OpenAI clients accumulate a call's deltas by its
    ``index``), or its finish reason."""
    if request.chat:
        delta: dict = {}
        if tool_call is not None:
            delta = {"role": "assistant", "content": None, "tool_calls": [tool_call_body(tool_call, streamed=True)]}
        elif text is not None:
            delta = {"role": "assistant", "content": text}
        choice = {"index": index, "delta": delta, "finish_reason": finish, "logprobs": logprobs_body(request, logprobs)}
    else:
        choice = {
            "index": index,
            "text": text or "",
            "finish_reason": finish,
            "logprobs": logprobs_body(request, logprobs),
        }
    return {
        "id": response_id(request, run),
        "object": _object(request, chunk=True),
        "created": int(time.time()),
        "model": request.model,
        "choices": [choice],
    }


def usage_body(run: Run) -> dict:
    """OpenAI's ``usage`` object from the built-in LIP's result, with the prompt tokens the
    worker served from the tenant's prefix cache as ``prompt_tokens_details.cached_tokens``
    (the run's metered ``cached_tokens``; pass the run with ``select_related("usage")`` from
    async code)."""
    usage: dict[str, Any] = run.result.get("usage", {}) if isinstance(run.result, dict) else {}
    prompt, completion = int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
    try:
        cached = int(run.usage.cached_tokens) if run.usage is not None else 0
    except ObjectDoesNotExist:  # still running, or ended without a usage row
        cached = 0
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": min(cached, prompt)},
    }


def usage_chunk(request: CompletionRequest, run: Run) -> dict:
    """The chunk ``stream_options.include_usage`` asks for: after the last choice, before
    ``[DONE]``, with the usage and an empty ``choices`` (as OpenAI sends it)."""
    return {
        "id": response_id(request, run),
        "object": _object(request, chunk=True),
        "created": int(time.time()),
        "model": request.model,
        "choices": [],
        "usage": usage_body(run),
    }


def error_body(
    message: str, type_: str, code: str | None = None, param: str | None = None, request_id: str | None = None
) -> dict:
    """OpenAI's error envelope (the ``openai`` client raises typed errors from it); ``param``
    names the request field at fault; a server error carries the ``request_id`` its cause is
    logged under (api/services/server_errors.py)."""
    error = {"message": message, "type": type_, "param": param, "code": code}
    if request_id is not None:
        error["request_id"] = request_id
    return {"error": error}
