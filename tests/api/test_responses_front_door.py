"""``/v1/responses`` without a worker: request validation (400 naming the parameter or item,
nothing run), 404s for unknown, foreign and unstored ids, how items become the built-in LIP's
chat (the conversation rebuilt from stored turns, the KV file named per chain), and settling a
stored response from its run's result. Generation itself is tested through the real stack
(tests/integration/test_openai_responses.py)."""

from __future__ import annotations

import pytest

from api.models import Plan, Run, StoredResponse, UsageRecord
from api.services import openai_requests, responses

pytestmark = pytest.mark.django_db


def _error(response, status: int) -> dict:
    assert response.status_code == status, response.content[:500]
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    return error


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": [{"type": "image", "url": "x"}]}, "input"),
        ({"input": [{"role": "wizard", "content": "x"}]}, "input"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input"),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "input"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input"),
        ({"input": []}, "input"),
        ({"input": 7}, "input"),
        ({"input": "hi", "reasoning": {"effort": "high"}}, "reasoning"),
        ({"input": "hi", "truncation": "auto"}, "truncation"),
        ({"input": "hi", "include": ["message.output_text.logprobs"]}, "include"),
        ({"input": "hi", "tool_choice": "required"}, "tool_choice"),
        ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools"),
        ({"input": "hi", "tools": [None]}, "tools"),
        ({"input": "hi", "background": True, "store": False}, "background"),
        ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "hi", "max_output_tokens": 4, "min_tokens": 5}, "min_tokens"),
        ({"input": "hi", "ignore_eos": True, "text": {"format": {"type": "json_object"}}}, "ignore_eos"),
        ({"input": "hi", "min_p": 0.1, "text": {"format": {"type": "json_object"}}}, "min_p"),
        ({"input": "hi", "repetition_penalty": 0}, "repetition_penalty"),
        ({"input": "hi", "top_k": -2}, "top_k"),
        ({"input": "hi", "instructions": "a\x00b"}, "instructions"),
        (
            {
                "input": "hi",
                "tools": [
                    {"type": "function", "name": f"f{i}", "parameters": {"type": "object", "description": "x" * 2000}}
                    for i in range(40)
                ],
            },
            "tools",
        ),
    ],
)
def test_bad_requests_are_400_naming_the_parameter(api_tenant_a, body, param):
    response = api_tenant_a.key_client().post("/v1/responses", {"model": "m", **body}, format="json")
    error = _error(response, 400)
    assert error["param"] == param, error
    assert Run.objects.count() == 0


def test_vllm_sampling_extras_and_nul_characters_reach_the_program(api_tenant_a):
    """What ``vllm bench serve``'s ``openai-responses`` backend sends (``ignore_eos``, prompts
    with U+0000 from its random datasets), and the rest of vLLM's extras, become the built-in
    program's args as on the chat endpoint; a stored turn keeps the U+0000 of its input."""
    from api.serializers.responses import ResponseCreateSerializer

    extras = {
        "ignore_eos": True,
        "min_tokens": 3,
        "top_k": 5,
        "min_p": 0.05,
        "repetition_penalty": 1.2,
        "presence_penalty": 0.5,
        "frequency_penalty": -0.5,
        "seed": 7,
    }
    request = {"model": "m", "input": "a\x00b", "max_output_tokens": 8, **extras}
    serializer = ResponseCreateSerializer(data=request)
    assert serializer.is_valid(), serializer.errors
    turn = responses.prepare(api_tenant_a.tenant, serializer)
    args = turn.completion.args
    assert {k: args[k] for k in extras} == extras
    assert args["messages"][-1]["content"].endswith("a\x00b") and args["max_tokens"] == 8

    plain = ResponseCreateSerializer(data={"model": "m", "input": "hi"})
    assert plain.is_valid(), plain.errors
    args = responses.prepare(api_tenant_a.tenant, plain).completion.args
    assert (args["ignore_eos"], args["min_tokens"], args["top_k"], args["repetition_penalty"]) == (False, 0, 0, 1.0)

    run = _run(api_tenant_a.tenant, {"choices": [], "usage": {}})
    row = StoredResponse.objects.create(
        tenant=api_tenant_a.tenant, run=run, input_items=[{"type": "message", "role": "user", "content": "a\x00b"}]
    )
    assert StoredResponse.objects.get(pk=row.pk).input_items[0]["content"] == "a\x00b"


def test_a_streamed_answer_without_tools_sends_its_first_delta_at_once(api_tenant_a):
    """Leading whitespace is held back only where tools are offered (whitespace before a tool
    call is no message); without tools it is the first token, sent as soon as it is made, so
    the client's time to first token is not the time to the first non-space."""
    from api.serializers.responses import ResponseCreateSerializer
    from api.views.responses import _Events

    def events_for(body: dict) -> _Events:
        serializer = ResponseCreateSerializer(data={"model": "m", **body})
        assert serializer.is_valid(), serializer.errors
        turn = responses.prepare(api_tenant_a.tenant, serializer)
        turn.run = _run(api_tenant_a.tenant, {})
        return _Events(turn)

    plain = events_for({"input": "hi"})
    sent = b"".join(plain.delta("\n"))
    assert b"response.output_item.added" in sent and b"response.output_text.delta" in sent
    assert plain.delta("") == []
    with_tools = events_for({"input": "hi", "tools": [{"type": "function", "name": "f"}]})
    assert with_tools.delta("\n") == []
    assert b"response.output_text.delta" in b"".join(with_tools.delta("Hello"))


def test_unknown_foreign_and_malformed_ids_are_404(api_tenant_a, api_tenant_b):
    row = StoredResponse.objects.create(tenant=api_tenant_a.tenant, status="completed", input_items=[])
    own = f"resp_{row.pk.hex}"
    assert api_tenant_a.key_client().get(f"/v1/responses/{own}").json()["id"] == own
    foreign = api_tenant_b.key_client()
    for path in (f"/v1/responses/{own}", "/v1/responses/resp_nothex", "/v1/responses/xyz"):
        assert _error(foreign.get(path), 404)["code"] == "not_found"
    assert _error(foreign.delete(f"/v1/responses/{own}"), 404)["code"] == "not_found"
    assert _error(foreign.post(f"/v1/responses/{own}/cancel"), 404)["code"] == "not_found"
    follow = foreign.post("/v1/responses", {"model": "m", "input": "hi", "previous_response_id": own}, format="json")
    assert _error(follow, 404)["param"] == "response_id"
    assert Run.objects.count() == 0
    assert _error(api_tenant_a.key_client().post(f"/v1/responses/{own}/cancel"), 400)["param"] == "response_id"
    assert api_tenant_a.key_client().delete(f"/v1/responses/{own}").json()["deleted"] is True
    assert not StoredResponse.objects.exists()


def _run(tenant, result: dict, status: str = "succeeded") -> Run:
    program = openai_requests.builtin_program(tenant)
    version = program.versions.order_by("-number").first()
    return Run.objects.create(tenant=tenant, program_version=version, status=status, result=result)


def test_a_follow_up_renders_the_stored_chain_and_keeps_its_kv_file(api_tenant_a):
    tenant = api_tenant_a.tenant
    call = {"index": 0, "id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'}
    result = {
        "choices": [{"index": 0, "text": "", "finish_reason": "tool_calls", "tool_calls": [call]}],
        "usage": {"prompt_tokens": 30, "completion_tokens": 9, "cached_tokens": 0},
    }
    run = _run(tenant, result)
    first = StoredResponse.objects.create(
        tenant=tenant,
        run=run,
        status="in_progress",
        request={"instructions": "Be brief."},
        input_items=[{"type": "message", "role": "user", "content": "Weather in Paris?"}],
        kv_name="resp-chain",
    )
    settled = responses.settle(first)
    assert settled.status == "completed" and settled.kv_expires_at is not None
    assert settled.output == [
        {
            "id": f"fc_{run.pk.hex}_0",
            "type": "function_call",
            "status": "completed",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city":"Paris"}',
        }
    ]
    body = responses.body(settled)
    assert body["usage"]["input_tokens"] == 30 and body["usage"]["input_tokens_details"] == {"cached_tokens": 0}

    from api.serializers.responses import ResponseCreateSerializer

    request = {
        "model": "m",
        "input": [{"type": "function_call_output", "call_id": "call_1", "output": "21C"}],
        "previous_response_id": f"resp_{first.pk.hex}",
        "instructions": "Be brief.",
    }
    serializer = ResponseCreateSerializer(data=request)
    assert serializer.is_valid(), serializer.errors
    turn = responses.prepare(tenant, serializer)
    args = turn.completion.args
    assert args["conversation"] == {"name": "resp-chain", "write": True}
    assert [m["role"] for m in args["messages"]] == ["system", "user", "assistant", "user"]
    assert "<tool_call>" in args["messages"][2]["content"] and "21C" in args["messages"][3]["content"]

    # No KV kept on a plan that keeps none; a new chain gets its own file name.
    Plan.objects.filter(name=tenant.plan).update(response_kv_ttl_s=0)
    assert "conversation" not in responses.prepare(tenant, serializer).completion.args
    Plan.objects.filter(name=tenant.plan).update(response_kv_ttl_s=60)
    fresh = ResponseCreateSerializer(data={"model": "m", "input": "hi"})
    assert fresh.is_valid()
    turn = responses.prepare(tenant, fresh)
    assert turn.completion.args["conversation"]["name"] == f"resp-{turn.id.hex}"


def test_cached_tokens_leave_out_what_a_changed_prompt_truncated_from_the_kept_file(api_tenant_a):
    """A follow-up with other instructions shares only a few tokens with the conversation's
    file: the worker metered the whole file as cached when it was opened, the usage says what
    the prompt reused (plus what the prefix cache served)."""
    tenant = api_tenant_a.tenant
    result = {
        "choices": [{"index": 0, "text": "Blue.", "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 65, "completion_tokens": 3, "cached_tokens": 3, "opened_tokens": 394},
    }
    run = _run(tenant, result)
    UsageRecord.objects.create(tenant=tenant, run=run, cached_tokens=394)
    assert responses.usage(run)["input_tokens_details"] == {"cached_tokens": 3}
    UsageRecord.objects.filter(run=run).update(cached_tokens=394 + 32)  # a prefix-cache hit besides
    assert responses.usage(run)["input_tokens_details"] == {"cached_tokens": 35}


def test_a_refused_run_settles_failed(api_tenant_a):
    refused = {"refused": {"code": "context_length_exceeded", "message": "too long", "prompt_tokens": 9}}
    row = StoredResponse.objects.create(
        tenant=api_tenant_a.tenant, run=_run(api_tenant_a.tenant, refused), status="in_progress"
    )
    settled = responses.settle(row)
    assert settled.status == "failed" and settled.error["code"] == "context_length_exceeded"
    assert settled.error["param"] == "input"


def test_openapi_schema_has_the_responses_routes(client):
    paths = client.get("/api/schema/?format=json").json()["paths"]
    assert "previous_response_id" in str(paths["/v1/responses"]["post"])
    assert {"get", "delete"} <= set(paths["/v1/responses/{response_id}"])
    assert "post" in paths["/v1/responses/{response_id}/cancel"]


def test_a_closed_tenants_stored_responses_are_purged(api_tenant_a):
    from django.utils import timezone

    from api.models import Tenant
    from api.services import tenant_closure

    tenant = api_tenant_a.tenant
    StoredResponse.objects.create(tenant=tenant, run=_run(tenant, {"choices": []}), status="completed")
    Tenant.objects.filter(pk=tenant.pk).update(closed_at=timezone.now())
    tenant_closure.purge(tenant.pk)
    assert not StoredResponse.objects.filter(tenant=tenant).exists()


def test_input_items_pages(api_tenant_a):
    items = [{"type": "message", "role": "user", "content": str(i)} for i in range(3)]
    row = StoredResponse.objects.create(tenant=api_tenant_a.tenant, status="completed", input_items=items)
    client = api_tenant_a.key_client()
    path = f"/v1/responses/resp_{row.pk.hex}/input_items"
    listed = client.get(path).json()
    assert [i["content"] for i in listed["data"]] == ["2", "1", "0"] and listed["has_more"] is False
    page = client.get(path, {"order": "asc", "limit": 2}).json()
    assert [i["content"] for i in page["data"]] == ["0", "1"] and page["has_more"] is True
    rest = client.get(path, {"order": "asc", "after": page["last_id"]}).json()
    assert [i["content"] for i in rest["data"]] == ["2"]
    assert _error(client.get(path, {"include": "x"}), 400)["param"] == "include"
    assert _error(client.get(path, {"limit": 0}), 400)["param"] == "limit"


def test_a_background_turn_that_ended_unseen_can_be_continued(api_tenant_a):
    from api.serializers.responses import ResponseCreateSerializer

    tenant = api_tenant_a.tenant
    result = {"choices": [{"index": 0, "text": "Paris.", "finish_reason": "stop"}], "usage": {"prompt_tokens": 5}}
    row = StoredResponse.objects.create(
        tenant=tenant,
        run=_run(tenant, result),
        status="in_progress",
        request={"background": True},
        input_items=[{"type": "message", "role": "user", "content": "Capital of France?"}],
    )
    serializer = ResponseCreateSerializer(
        data={"model": "m", "input": "And Germany?", "previous_response_id": f"resp_{row.pk.hex}"}
    )
    assert serializer.is_valid(), serializer.errors
    messages = responses.prepare(tenant, serializer).completion.args["messages"]
    assert [m["content"] for m in messages if m["role"] != "system"] == ["Capital of France?", "Paris.", "And Germany?"]
    assert StoredResponse.objects.get(pk=row.pk).status == "completed"


def test_a_request_django_refuses_before_any_view_gets_the_envelope(api_tenant_a, settings):
    """A form with more fields than DATA_UPLOAD_MAX_NUMBER_FIELDS is refused by Django itself
    (SuspiciousOperation): still JSON in each API's own envelope, never Django's HTML page."""
    fields = "&".join(f"hosts={i}" for i in range(settings.DATA_UPLOAD_MAX_NUMBER_FIELDS + 1))
    client = api_tenant_a.key_client()
    form = "application/x-www-form-urlencoded"
    rest = client.put("/api/v1/tool-hosts", fields, content_type=form)
    assert rest.status_code == 400 and rest["Content-Type"] == "application/json", rest.content[:300]
    assert (
        rest.json()["error"]["code"] == "invalid" and "DATA_UPLOAD_MAX_NUMBER_FIELDS" in rest.json()["error"]["message"]
    )
    openai_shaped = client.post("/v1/responses", fields, content_type=form)
    error = _error(openai_shaped, 400)
    assert error["type"] == "invalid_request_error", error
