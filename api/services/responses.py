"""OpenAI's Responses API (``/v1/responses``) on the built-in LIP's runs.

A response is one run of the tenant's built-in program (api/services/openai_requests.py), with
the conversation rendered by the chat endpoint's machinery (api/services/openai_tools.py:
roles, function calls and their outputs, tools in the prompt and calls under a grammar). What
this module adds:

- **Items both ways**: input items (and, for ``previous_response_id``, the whole stored chain
  before them: each turn's instructions are its own, as OpenAI defines them) become chat
  messages; a run's result becomes output items (an assistant ``message`` with ``output_text``,
  ``function_call`` items with the call's id and JSON arguments, stored as returned).
- **Stored responses** (:class:`~api.models.StoredResponse`, ``store`` true): the turn's input
  and output items and its link to the previous turn, so a conversation is always rebuilt from
  the database. Another tenant's id, an unknown one and a ``store: false`` one are all a 404.
- **The conversation's KV**: a stored chain keeps its KV as a named tenant KV file
  (``resp-<first turn's id>``, billed as KV storage like every KV file). The LIP opens it,
  keeps the longest prefix its tokens share with the new prompt and prefills only the rest
  (usage ``input_tokens_details.cached_tokens``); a file that is gone, busy or holds another
  branch just means more is recomputed. The file lives ``response_kv_ttl_s`` (plan) after the
  chain's last turn; :func:`expire_kv` (Celery beat) removes files past it.
- **Background responses** are settled by whoever observes their run end first (the create
  call or a retrieve), so no process has to wait for them.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from api.models import ApiKey, Plan, Run, StoredResponse, Tenant, UsageRecord
from api.serializers.openai import DEFAULT_MAX_TOKENS, MAX_MESSAGES, MAX_PROMPT_CHARS
from api.services import openai_requests
from api.services.openai_requests import CompletionRequest, error_body
from api.services.openai_tools import call_schema_text, render_messages
from api.services.quotas import PlanLimits, plan_limits
from api.services.runs import RunConflict, cancel_run

log = logging.getLogger(__name__)

#: Turns of a chain followed back from ``previous_response_id`` (each has at least one message).
MAX_CHAIN = MAX_MESSAGES
KV_PREFIX = "resp-"
ID_PREFIX = "resp_"


class NotFound(Exception):
    """No such stored response of this tenant (OpenAI's 404)."""


class Refused(Exception):
    """The request cannot be served as asked: OpenAI's 400 ``body``."""

    def __init__(self, body: dict) -> None:
        super().__init__(body["error"]["message"])
        self.body = body


@dataclass
class Turn:
    """A response being created: what its body echoes and how its run is asked."""

    id: uuid.UUID
    created_at: float
    echo: dict
    input_items: list[dict]
    store: bool
    background: bool
    stream: bool
    completion: CompletionRequest | None = None
    previous: StoredResponse | None = None
    row: StoredResponse | None = None
    run: Run | None = None
    kv_name: str = ""
    #: The plan's ``response_kv_ttl_s`` as the request read it (0: no conversation KV file).
    kv_ttl_s: int = 0
    extra: dict = field(default_factory=dict)


def public_id(pk: uuid.UUID) -> str:
    return f"{ID_PREFIX}{pk.hex}"


def parse_id(value: str) -> uuid.UUID:
    """The row id of ``resp_<hex>``; anything else is unknown (404)."""
    if not value.startswith(ID_PREFIX):
        raise NotFound(value)
    try:
        return uuid.UUID(hex=value[len(ID_PREFIX) :])
    except ValueError:
        raise NotFound(value) from None


def lookup(tenant: Tenant, value: str) -> StoredResponse:
    try:
        return StoredResponse.objects.get(tenant=tenant, pk=parse_id(value))
    except StoredResponse.DoesNotExist:
        raise NotFound(value) from None


def not_found_body(value: str) -> dict:
    message = f"Response with id '{value[:100]}' not found."
    return error_body(message, "invalid_request_error", "not_found", "response_id")


# ------------------------------------------------------------------------ items -> messages
def items_to_messages(items: list[dict]) -> list[dict]:
    """Input or output items as the chat endpoint's messages: consecutive function calls are
    one assistant message's ``tool_calls`` (joined to the assistant text before them)."""
    messages: list[dict] = []
    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            messages.append({"role": item["role"], "content": _item_text(item["content"])})
        elif kind == "function_call":
            call = {"id": item["call_id"], "type": "function"}
            call["function"] = {"name": item["name"], "arguments": item["arguments"]}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
    return messages


def _item_text(content: object) -> str:
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content or "")


def chain(previous: StoredResponse) -> list[StoredResponse]:
    """The stored turns up to ``previous``, oldest first."""
    turns: list[StoredResponse] = []
    row: StoredResponse | None = previous
    while row is not None:
        turns.append(row)
        if len(turns) > MAX_CHAIN:
            raise Refused(
                error_body(f"the conversation is longer than {MAX_CHAIN} turns", "invalid_request_error", param="input")
            )
        row = StoredResponse.objects.filter(pk=row.previous_id, tenant_id=row.tenant_id).first()
    return turns[::-1]


def conversation(turn: Turn, instructions: str | None) -> list[dict]:
    """The chat messages of the whole conversation: every stored turn's input and output,
    then this turn's instructions (as the system message) and input."""
    items: list[dict] = []
    if turn.previous is not None:
        for row in chain(turn.previous):
            items += row.input_items + row.output
    messages = items_to_messages(items + turn.input_items)
    if instructions:
        messages.insert(0, {"role": "system", "content": instructions})
    if len(messages) > MAX_MESSAGES:
        raise Refused(
            error_body(
                f"the conversation has more than {MAX_MESSAGES} messages", "invalid_request_error", param="input"
            )
        )
    return messages


# ------------------------------------------------------------------------- create a turn
def prepare(tenant: Tenant, serializer: Any) -> Turn:
    """The turn of a validated request (``ResponseCreateSerializer``): the previous response
    resolved (else :class:`NotFound`), the conversation rendered and the run's args built."""
    data = serializer.validated_data
    previous = None
    if data.get("previous_response_id"):
        previous = settle(lookup(tenant, data["previous_response_id"]))  # a background one may have ended
        if previous.status not in ("completed", "incomplete"):
            message = f"previous response {data['previous_response_id']} is {previous.status}: it cannot be continued"
            raise Refused(error_body(message, "invalid_request_error", param="previous_response_id"))
    tools = serializer.tools_as_written()
    choice = data.get("tool_choice") or ("auto" if tools else "none")
    max_tokens = data.get("max_output_tokens") or DEFAULT_MAX_TOKENS
    store = data.get("store") is not False
    fmt = (data.get("text") or {}).get("format") or {"type": "text"}
    echo = {
        "instructions": data.get("instructions"),
        "max_output_tokens": data.get("max_output_tokens"),
        "parallel_tool_calls": data.get("parallel_tool_calls") is not False,
        "previous_response_id": data.get("previous_response_id"),
        "temperature": 1.0 if data.get("temperature") is None else data["temperature"],
        "top_p": 1.0 if data.get("top_p") is None else data["top_p"],
        "tool_choice": choice,
        "tools": [{"type": "function", **t, "strict": False} for t in tools],
        "text": {"format": dict(serializer.initial_data["text"]["format"]) if fmt["type"] != "text" else fmt},
        "metadata": data.get("metadata") or {},
        "user": data.get("user"),
    }
    turn = Turn(
        id=uuid.uuid4(),
        created_at=time.time(),
        echo=echo,
        input_items=data["input"],
        store=store,
        background=bool(data.get("background")),
        stream=bool(data.get("stream")),
        previous=previous,
    )
    messages = conversation(turn, data.get("instructions"))
    offered = tools if choice != "none" else []
    rendered = render_messages(messages, offered)
    prompt_chars = sum(len(m["content"]) for m in rendered)
    if prompt_chars > MAX_PROMPT_CHARS:
        message = f"the conversation is longer than {MAX_PROMPT_CHARS} characters"
        raise Refused(error_body(message, "invalid_request_error", param="input"))
    args: dict[str, Any] = {
        "messages": rendered,
        "max_tokens": max_tokens,
        "temperature": echo["temperature"],
        "top_p": echo["top_p"],
        **serializer.sampling_extras(),
        "n": 1,
    }
    schema = serializer.schema_as_written()
    if schema is not None:
        args["json_schema"] = schema
    if offered:
        callable_ = [t for t in offered if not isinstance(choice, dict) or t["name"] == choice["name"]]
        args["tools"] = {
            "call_schema": call_schema_text(callable_),
            "mode": "auto" if choice == "auto" else "required",
            "parallel": echo["parallel_tool_calls"],
        }
    turn.kv_ttl_s = _kv_ttl(tenant)
    if turn.kv_ttl_s:
        if store:
            turn.kv_name = (previous.kv_name if previous is not None else "") or f"{KV_PREFIX}{turn.id.hex}"
            args["conversation"] = {"name": turn.kv_name, "write": True}
        elif previous is not None and previous.kv_name:  # read the chain's KV, leave it as it is
            args["conversation"] = {"name": previous.kv_name, "write": False}
    turn.completion = CompletionRequest(
        chat=True,
        args=args,
        stream=turn.stream,
        model=openai_requests.model_name(),
        run_max_tokens=prompt_chars + 64 + max_tokens,
    )
    return turn


#: A conversation KV file's TTL for a tenant whose plan has no row (the field's default).
DEFAULT_KV_TTL_S = 3600


def _kv_ttl(tenant: Tenant) -> int:
    """The plan's ``response_kv_ttl_s`` (0: conversations keep no KV file)."""
    ttl = Plan.objects.filter(name=tenant.plan).values_list("response_kv_ttl_s", flat=True).first()
    return DEFAULT_KV_TTL_S if ttl is None else int(ttl)


def start(
    tenant: Tenant,
    api_key: ApiKey | None,
    turn: Turn,
    plan: PlanLimits | None = None,
    tokens_used: int | None = None,
) -> Turn:
    """Create the run (raises ``PlanQuotaExceeded`` / ``ConcurrencyLimitReached`` as the chat
    endpoint's start does) and, for a stored turn, its row in the same breath. ``plan``: the
    tenant's plan as the request read it (read here when not given). ``tokens_used``: as
    ``openai_requests.start``'s."""
    assert turn.completion is not None
    plan = plan or plan_limits(tenant)
    # One transaction for the run and a stored turn's row; an unstored turn's run is created in
    # create_run's own (an outer one only added a savepoint around it).
    with transaction.atomic() if turn.store else contextlib.nullcontext():
        turn.run = openai_requests.start(tenant, api_key, turn.completion, plan, tokens_used)
        if turn.store:
            ttl = turn.kv_ttl_s
            expires = timezone.now() + timedelta(seconds=ttl + plan.max_run_seconds) if ttl else None
            turn.row = StoredResponse.objects.create(
                id=turn.id,
                tenant=tenant,
                run=turn.run,
                previous=turn.previous,
                status="in_progress",
                request={**turn.echo, "background": turn.background},
                input_items=turn.input_items,
                kv_name=turn.kv_name,
                kv_expires_at=expires,
            )
    return turn


# ------------------------------------------------------------------------ run -> response
def output_items(run: Run) -> tuple[list[dict], str | None]:
    """The output items of a succeeded run and why it is incomplete (``None``: complete)."""
    result: dict = run.result if isinstance(run.result, dict) else {}
    choices = result.get("choices") or [{}]
    choice = choices[0]
    finish = choice.get("finish_reason")
    incomplete = "max_output_tokens" if finish == "length" else None
    items: list[dict] = []
    text = choice.get("text") or ""
    if text.strip() or not choice.get("tool_calls"):
        items.append(message_item(run, text, "incomplete" if incomplete else "completed"))
    for call in choice.get("tool_calls") or []:
        items.append(call_item(run, call))
    return items, incomplete


def message_item(run: Run, text: str | None, status: str) -> dict:
    content = [] if text is None else [{"type": "output_text", "text": text, "annotations": []}]
    return {"id": f"msg_{run.pk.hex}", "type": "message", "status": status, "role": "assistant", "content": content}


def call_item(run: Run, call: dict, arguments: str | None = None) -> dict:
    return {
        "id": f"fc_{run.pk.hex}_{call['index']}",
        "type": "function_call",
        "status": "completed" if arguments is None else "in_progress",
        "call_id": call["id"],
        "name": call["name"],
        "arguments": call["arguments"] if arguments is None else arguments,
    }


def usage(run: Run, metered: int | None = None) -> dict:
    """OpenAI's usage of a finished turn (sync code only: it reads the run's usage row).
    ``cached_tokens``: the prompt tokens not computed: those the conversation's kept KV file
    shared with the prompt (what the built-in program reports) plus those the worker's prefix
    cache served. The worker's metered count has both, but it counts the whole kept file at its
    open, also the part a changed prompt (other instructions, an edited turn) truncated away: that
    part, what the file held less what was reused, is taken off it. ``metered``: the usage row's
    ``cached_tokens`` when the caller has the row (read here when not given)."""
    result: dict = run.result if isinstance(run.result, dict) else {}
    used = result.get("usage") or {}
    prompt, completion = int(used.get("prompt_tokens", 0)), int(used.get("completion_tokens", 0))
    if metered is None:
        metered = UsageRecord.objects.filter(run_id=run.pk).values_list("cached_tokens", flat=True).first() or 0
    reused = int(used.get("cached_tokens", 0))
    dropped = max(0, int(used.get("opened_tokens", reused)) - reused)
    cached = min(prompt, max(reused, int(metered) - dropped))
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


def outcome(run: Run, metered: int | None = None) -> dict:
    """What a finished run makes of a response: status, output, usage, error, incomplete.
    ``metered``: as :func:`usage` takes it."""
    if run.status == "succeeded":
        refused = openai_requests.refusal(openai_compat_request(), run)
        if refused is not None:
            param = refused["error"].get("param")
            error = {
                "code": refused["error"].get("code") or "invalid_request",
                "message": refused["error"]["message"],
                "param": "input" if param in (None, "messages") else param,
            }
            return {"status": "failed", "output": [], "usage": None, "error": error, "incomplete": None}
        items, incomplete = output_items(run)
        status = "incomplete" if incomplete else "completed"
        used = usage(run, metered)
        return {"status": status, "output": items, "usage": used, "error": None, "incomplete": incomplete}
    if run.status == "cancelled":
        return {"status": "cancelled", "output": [], "usage": None, "error": None, "incomplete": None}
    if run.status in Run.TERMINAL:
        # The run's error text stays out (the built-in program's carries server paths).
        words = "timed out" if run.status == "timed_out" else run.status
        error = {"code": "server_error", "message": f"run {run.pk} {words}"}
        return {"status": "failed", "output": [], "usage": None, "error": error, "incomplete": None}
    return {"status": "in_progress", "output": [], "usage": None, "error": None, "incomplete": None}


def openai_compat_request() -> CompletionRequest:
    """The chat-shaped request :func:`openai_requests.refusal` reads (only ``chat`` matters)."""
    return CompletionRequest(chat=True, args={}, stream=False, model=openai_requests.model_name(), run_max_tokens=0)


def settle(row: StoredResponse, ended: Run | None = None, metered: int | None = None) -> StoredResponse:
    """Record the outcome of a stored response whose run ended (idempotent; a response still
    running is left as it is). The chain's KV file lives on ``response_kv_ttl_s`` from now.
    ``ended`` and ``metered``: the row's run as recorded once it ended, and its usage row's
    ``cached_tokens``, when the caller has them (read here when not given)."""
    if row.status not in ("queued", "in_progress") or row.run_id is None:
        return row
    if ended is not None and ended.pk == row.run_id:
        run = ended
    else:
        run, metered = Run.objects.get(pk=row.run_id), None
    result = outcome(run, metered)
    if result["status"] == "in_progress":
        if run.status == "running" and row.status == "queued":
            row.status = "in_progress"
        return row
    with transaction.atomic():
        locked = StoredResponse.objects.select_for_update(of=("self",)).select_related("tenant").get(pk=row.pk)
        if locked.status not in ("queued", "in_progress"):
            return locked
        locked.status = result["status"]
        locked.output = result["output"]
        locked.usage = result["usage"]
        locked.error = result["error"]
        if result["incomplete"]:
            locked.request = {**locked.request, "incomplete_details": {"reason": result["incomplete"]}}
        ttl = _kv_ttl(locked.tenant)
        if locked.kv_name and ttl:
            locked.kv_expires_at = timezone.now() + timedelta(seconds=ttl)
        locked.save(update_fields=["status", "output", "usage", "error", "request", "kv_expires_at"])
    return locked


def body(
    turn_or_row: Turn | StoredResponse, run: Run | None = None, status: str | None = None, metered: int | None = None
) -> dict:
    """OpenAI's response object, of a turn being served (with its run when it ended) or of a
    stored row. ``metered``: as :func:`usage` takes it."""
    if isinstance(turn_or_row, StoredResponse):
        row = turn_or_row
        echo = dict(row.request)
        result = {
            "status": row.status,
            "output": row.output,
            "usage": row.usage,
            "error": row.error,
            "incomplete": (echo.get("incomplete_details") or {}).get("reason"),
        }
        rid, created, store = row.pk, row.created_at.timestamp(), True
        background = bool(echo.pop("background", False))
    else:
        turn = turn_or_row
        echo = dict(turn.echo)
        if run is not None and run.status in Run.TERMINAL:
            result = outcome(run, metered)
        else:
            result = {"status": status or "in_progress", "output": [], "usage": None, "error": None, "incomplete": None}
        rid, created, store, background = turn.id, turn.created_at, turn.store, turn.background
    echo.pop("incomplete_details", None)
    return {
        "id": public_id(rid),
        "object": "response",
        "created_at": int(created),
        "status": result["status"],
        "background": background,
        "error": result["error"],
        "incomplete_details": {"reason": result["incomplete"]} if result["incomplete"] else None,
        "model": openai_requests.model_name(),
        "output": result["output"],
        **echo,
        "store": store,
        "truncation": "disabled",
        "usage": result["usage"],
    }


# ------------------------------------------------------------------ retrieve, cancel, delete
def retrieve(tenant: Tenant, value: str) -> dict:
    return body(settle(lookup(tenant, value)))


def cancel(tenant: Tenant, value: str) -> dict:
    """Cancel a background response still running (its run is cancelled and billed for what
    it did); one that already ended is returned as it is. Only background responses can be
    cancelled, as in OpenAI's API."""
    row = settle(lookup(tenant, value))
    if not row.request.get("background"):
        message = "Only responses created with background: true can be cancelled."
        raise Refused(error_body(message, "invalid_request_error", param="response_id"))
    if row.status in ("queued", "in_progress") and row.run_id is not None:
        try:
            cancel_run(Run.objects.get(pk=row.run_id))
        except RunConflict:
            pass
        row = settle(row)
    return body(row)


def delete(tenant: Tenant, value: str) -> dict:
    """Delete a stored response (its run, billed, stays). Its chain's KV file goes with the
    last stored turn that uses it; later turns that continued it stay and are rebuilt from
    their own rows and the rows still there."""
    row = lookup(tenant, value)
    name = row.kv_name
    row.delete()
    if name and not StoredResponse.objects.filter(tenant=tenant, kv_name=name).exists():
        _remove_kv(tenant, name)
    return {"id": value, "object": "response.deleted", "deleted": True}


def _remove_kv(tenant: Tenant, name: str) -> bool:
    """Remove a conversation's KV file from the workers holding it (gone already counts as
    removed; api/services/kvfiles.py)."""
    from api.services import kvfiles

    try:
        kvfiles.delete_named(tenant, name)
    except kvfiles.WorkerUnavailable as exc:  # a worker is away: the sweep tries again later
        log.warning("response_kv_remove_failed tenant=%s name=%s error=%s", tenant.slug, name, exc)
        return False
    return True


def expire_kv(now: Any = None) -> int:
    """Remove the KV files of conversations whose last turn is older than their plan's TTL
    (Celery beat): a chain's file goes when none of its turns' expiry is still ahead. Their
    rows keep everything, so a later follow-up recomputes the conversation. Returns how many
    files went."""
    now = now or timezone.now()
    due = (
        StoredResponse.objects.filter(kv_expires_at__lt=now)
        .exclude(kv_name="")
        .values_list("tenant_id", "kv_name")
        .distinct()
    )
    removed = 0
    for tenant_id, name in list(due[:1000]):
        rows = StoredResponse.objects.filter(tenant_id=tenant_id, kv_name=name)
        if rows.filter(kv_expires_at__gte=now).exists():
            continue
        tenant = Tenant.objects.get(pk=tenant_id)
        if _remove_kv(tenant, name):
            rows.update(kv_name="", kv_expires_at=None)
            removed += 1
    return removed
