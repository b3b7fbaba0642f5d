"""OpenAI-compatible completions served by a built-in LIP through the ordinary run path.

A request becomes a run of the tenant's ``openai-compat`` program (created on first use and
re-versioned when the built-in source changes), so quotas, sandboxing, batching and billing are
exactly those of any other run. This module owns the mapping both ways: request -> LIP args,
LIP result / stream messages -> OpenAI response objects and chunks.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.db import transaction

from api.models import ApiKey, Program, Run, Tenant
from api.services import programs
from api.services.quotas import plan_limits
from api.services.runs import RunConflict, cancel_run, create_run

log = logging.getLogger(__name__)

BUILTIN_PROGRAM = "openai-compat"
BUILTIN_SOURCE = Path(__file__).resolve().parent.parent / "builtin_lips" / "openai_compat.py"


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


def model_name() -> str:
    return settings.SYMPHONY_MODEL_NAME


def builtin_program(tenant: Tenant) -> Program:
    """The tenant's built-in program, with the current built-in source as its latest version."""
    source = BUILTIN_SOURCE.read_bytes()
    digest = hashlib.sha256(source).hexdigest()
    with transaction.atomic():
        program, _ = Program.objects.select_for_update().get_or_create(
            tenant=tenant,
            name=BUILTIN_PROGRAM,
            defaults={"description": "Built-in LIP serving /v1/chat/completions and /v1/completions"},
        )
        latest = program.versions.order_by("-number").first()
        if latest is None or latest.sha256 != digest:
            programs.add_version(program, "openai_compat.py", source)
    return program


def start(tenant: Tenant, api_key: ApiKey | None, request: CompletionRequest) -> Run:
    """Create the run (quota-checked like any other); raises ``QuotaExceeded``."""
    program = builtin_program(tenant)
    # The worker meters the real count; the estimate only must not ask for more than the plan.
    limits = {"max_tokens": min(request.run_max_tokens, plan_limits(tenant).max_tokens_per_run)}
    run, _ = create_run(tenant, program, None, request.args, limits, api_key=api_key)
    return run


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


def completion_body(request: CompletionRequest, run: Run) -> dict:
    """The non-streaming response for a run that succeeded."""
    result = run.result or {}
    choices = []
    for choice in result.get("choices", []):
        entry: dict = {"index": choice["index"], "finish_reason": choice["finish_reason"], "logprobs": None}
        if request.chat:
            entry["message"] = {"role": "assistant", "content": choice["text"]}
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


def chunk_body(request: CompletionRequest, run: Run, index: int, text: str | None, finish: str | None) -> dict:
    """One streaming chunk: a text delta of choice ``index``, or its finish reason."""
    if request.chat:
        delta = {"role": "assistant", "content": text} if text is not None else {}
        choice = {"index": index, "delta": delta, "finish_reason": finish, "logprobs": None}
    else:
        choice = {"index": index, "text": text or "", "finish_reason": finish, "logprobs": None}
    return {
        "id": response_id(request, run),
        "object": _object(request, chunk=True),
        "created": int(time.time()),
        "model": request.model,
        "choices": [choice],
    }


def usage_body(run: Run) -> dict:
    """OpenAI's ``usage`` object from the built-in LIP's result."""
    usage = (run.result or {}).get("usage", {}) if isinstance(run.result, dict) else {}
    prompt, completion = int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


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


def error_body(message: str, type_: str, code: str | None = None) -> dict:
    """OpenAI's error envelope (the ``openai`` client raises typed errors from it)."""
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}
