"""The ``/v1`` front door without a worker: every path answers in OpenAI's error envelope,
``/v1/models/<id>``, the concurrency queue's bounded wait, the OpenAPI schema, and request
validation (parameters honoured or refused by name). The generation itself is tested through
the real stack and real clients (tests/integration/test_openai_clients.py)."""

from __future__ import annotations

import json
import time

import pytest

from api.models import Plan, Run

pytestmark = pytest.mark.django_db


def _error(response, status: int) -> dict:
    assert response.status_code == status, response.content[:500]
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    return error


def test_unknown_routes_wrong_methods_and_embeddings_answer_openai_json(api_tenant_a):
    client = api_tenant_a.key_client()
    assert _error(client.get("/v1/nothing/here"), 404)["code"] == "not_found"
    assert _error(client.post("/v1/audio/speech", {}, format="json"), 404)["code"] == "not_found"
    embeddings = _error(client.post("/v1/embeddings", {"model": "m", "input": "x"}, format="json"), 404)
    assert "not supported by this deployment" in embeddings["message"], embeddings
    wrong = client.get("/v1/chat/completions")
    assert _error(wrong, 405)["code"] == "method_not_allowed" and wrong["Allow"] == "POST"
    assert client.delete("/v1/models")["Allow"] == "GET"
    assert _error(client.put("/v1/completions", {}, format="json"), 405)["type"] == "invalid_request_error"


def test_models_by_id(api_tenant_a, settings):
    client = api_tenant_a.key_client()
    name = settings.SYMPHONY_MODEL_NAME
    listed = client.get("/v1/models").json()["data"]
    assert [m["id"] for m in listed] == [name]
    one = client.get(f"/v1/models/{name}")
    assert one.status_code == 200 and one.json() == listed[0], one.content
    missing = _error(client.get("/v1/models/gpt-9"), 404)
    assert missing["code"] == "model_not_found" and missing["param"] == "model", missing
    assert _error(api_tenant_a.session_client().get(f"/v1/models/{name}"), 401)["code"] == "invalid_api_key"


def test_over_the_concurrency_limit_waits_a_bounded_time_then_429_with_retry_after(api_tenant_a, settings):
    Plan.objects.filter(name=api_tenant_a.tenant.plan).update(max_concurrent_runs=0)
    settings.SYMPHONY_OPENAI_QUEUE_S = 0.5
    client = api_tenant_a.key_client()
    started = time.monotonic()
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    refused = client.post("/v1/chat/completions", body, format="json")
    waited = time.monotonic() - started
    error = _error(refused, 429)
    assert error["code"] == "rate_limit_exceeded" and refused["Retry-After"] == "1", error
    assert 0.5 <= waited < 5, waited
    assert Run.objects.count() == 0


def test_openapi_schema_has_the_v1_routes_and_run_events(client):
    schema = client.get("/api/schema/?format=json").json()
    paths = schema["paths"]
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/models/{model_id}"):
        assert path in paths, sorted(paths)
    assert "post" in paths["/v1/chat/completions"] and "tools" in str(paths["/v1/chat/completions"])
    assert "text/event-stream" in paths["/api/v1/runs/{run_id}/events"]["get"]["responses"]["200"]["content"]


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"unit": {"type": "string", "enum": ["c", "f"]}, "city": {"type": "string"}},
            "required": ["city", "unit"],
        },
    },
}


@pytest.mark.parametrize(
    ("path", "extra", "param"),
    [
        ("/v1/chat/completions", {"functions": [{"name": "f"}]}, "functions"),
        ("/v1/chat/completions", {"reasoning_effort": "high"}, "reasoning_effort"),
        ("/v1/chat/completions", {"logprobs": False, "top_logprobs": 3}, "top_logprobs"),
        ("/v1/chat/completions", {"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
        ("/v1/chat/completions", {"tool_choice": "required"}, "tool_choice"),
        (
            "/v1/chat/completions",
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice",
        ),
        ("/v1/chat/completions", {"tools": [WEATHER, WEATHER]}, "tools"),
        ("/v1/chat/completions", {"tools": [None]}, "tools"),
        (
            "/v1/chat/completions",
            {
                "messages": [
                    {"role": "user", "content": "x"},
                    {"role": "assistant", "content": None, "tool_calls": [None]},
                ]
            },
            "messages",
        ),
        ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools"),
        (
            "/v1/chat/completions",
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"description": "x" * 70_000}}}]},
            "tools",
        ),
        ("/v1/chat/completions", {"min_p": 0.1, "response_format": {"type": "json_object"}}, "min_p"),
        ("/v1/chat/completions", {"logit_bias": {"abc": 1}}, "logit_bias"),
        ("/v1/chat/completions", {"logit_bias": {"5": 101}}, "logit_bias"),
        ("/v1/chat/completions", {"presence_penalty": 3}, "presence_penalty"),
        ("/v1/completions", {"suffix": "x"}, "suffix"),
        ("/v1/completions", {"best_of": 2}, "best_of"),
        ("/v1/completions", {"logprobs": 6}, "logprobs"),
        ("/v1/completions", {"prompt": [[1, 2], "x", 3]}, "prompt"),
        ("/v1/completions", {"prompt": ["a"] * 17}, "prompt"),
        ("/v1/completions", {"prompt": ["a"] * 5, "n": 8}, "n"),
        ("/v1/chat/completions", {"stream_options": {"include_usage": True}}, "stream_options"),
        ("/v1/completions", {"stream": False, "stream_options": {"include_usage": True}}, "stream_options"),
        ("/v1/chat/completions", {"max_tokens": 5, "max_completion_tokens": 5}, "max_tokens"),
        ("/v1/chat/completions", {"min_tokens": 9, "max_tokens": 4}, "min_tokens"),
        ("/v1/chat/completions", {"ignore_eos": True, "stop": ["x"]}, "ignore_eos"),
        ("/v1/completions", {"min_tokens": 2, "response_format": {"type": "json_object"}}, "min_tokens"),
    ],
)
def test_parameters_not_honoured_are_a_400_naming_them(api_tenant_a, path, extra, param):
    body = {**CHAT, **extra} if path.endswith("chat/completions") else {"model": "m", "prompt": "p", **extra}
    error = _error(api_tenant_a.key_client().post(path, body, format="json"), 400)
    assert error["param"] == param and error["type"] == "invalid_request_error", error
    assert Run.objects.count() == 0


@pytest.mark.parametrize(
    ("message", "why"),
    [
        ({"role": "assistant", "content": None}, "may be null only"),
        ({"role": "tool", "content": "42"}, "tool_call_id"),
        (
            {
                "role": "user",
                "content": "x",
                "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
            },
            "only assistant",
        ),
        ({"role": "user", "content": "x", "weird": 1}, "unsupported message field"),
        ({"role": "critic", "content": "x"}, "critic"),
    ],
)
def test_malformed_messages_are_a_400(api_tenant_a, message, why):
    response = api_tenant_a.key_client().post("/v1/chat/completions", {**CHAT, "messages": [message]}, format="json")
    error = _error(response, 400)
    assert error["param"] == "messages" and why in error["message"], error


def _request(serializer_class, body):
    from api.serializers.openai import ChatCompletionSerializer  # noqa: F401

    serializer = serializer_class(data=body)
    assert serializer.is_valid(), serializer.errors
    return serializer.to_completion_request()


def test_tools_rendered_in_the_system_prompt_and_their_schema_keeps_its_key_order():
    from api.serializers.openai import ChatCompletionSerializer

    messages = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "warm"},
    ]
    parsed = _request(
        ChatCompletionSerializer, {**CHAT, "messages": messages, "tools": [WEATHER], "tool_choice": "required"}
    )
    rendered = parsed.args["messages"]
    assert [m["role"] for m in rendered] == ["system", "user", "assistant", "user"], rendered
    assert (
        rendered[0]["content"].startswith("Be brief.\n\n# Tools") and '"name": "get_weather"' in rendered[0]["content"]
    )
    assert (
        rendered[2]["content"] == '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    )
    assert rendered[3]["content"] == "<tool_response>\nsunny\n</tool_response>\n<tool_response>\nwarm\n</tool_response>"
    tools = parsed.args["tools"]
    assert tools["mode"] == "required" and tools["parallel"] is True
    schema = tools["call_schema"]
    # The parameters' properties in the order the client wrote them (unit before city), as text.
    assert schema.index('"unit"') < schema.index('"city"') and '"const": "get_weather"' in schema, schema
    named = _request(
        ChatCompletionSerializer,
        {
            **CHAT,
            "tools": [WEATHER],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "parallel_tool_calls": False,
        },
    )
    assert named.args["tools"]["mode"] == "required" and named.args["tools"]["parallel"] is False
    none = _request(ChatCompletionSerializer, {**CHAT, "tools": [WEATHER], "tool_choice": "none"})
    assert "tools" not in none.args and "# Tools" not in json.dumps(none.args["messages"])


def test_sampling_parameters_reach_the_program_and_response_schema_keeps_key_order():
    from api.serializers.openai import ChatCompletionSerializer, CompletionSerializer

    schema = {"type": "object", "properties": {"zeta": {"type": "string"}, "alpha": {"type": "string"}}}
    parsed = _request(
        ChatCompletionSerializer,
        {
            **CHAT,
            "top_k": 5,
            "min_p": 0.1,
            "presence_penalty": 0.5,
            "frequency_penalty": -0.5,
            "logit_bias": {"42": -100},
            "stop_token_ids": [7],
            "logprobs": True,
            "top_logprobs": 2,
            "user": "someone",
        },
    )
    args = parsed.args
    assert (args["top_k"], args["min_p"], args["presence_penalty"], args["frequency_penalty"]) == (5, 0.1, 0.5, -0.5)
    assert args["logit_bias"] == {"42": -100.0} and args["stop_token_ids"] == [7] and args["logprobs"] == 2
    structured = _request(
        ChatCompletionSerializer,
        {**CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}},
    )
    assert json.loads(structured.args["json_schema"]) == schema
    assert structured.args["json_schema"].index("zeta") < structured.args["json_schema"].index("alpha")
    listed = _request(CompletionSerializer, {"model": "m", "prompt": ["a", "b"], "n": 2, "echo": True, "logprobs": 0})
    assert listed.args["prompts"] == ["a", "b"] and listed.args["echo"] and listed.args["logprobs"] == 0
    assert _request(CompletionSerializer, {"model": "m", "prompt": [1, 2, 3]}).args["prompts"] == [[1, 2, 3]]
    assert _request(CompletionSerializer, {"model": "m", "prompt": [[1], [2, 3]]}).args["prompts"] == [[1], [2, 3]]
    assert _request(CompletionSerializer, {"model": "m", "prompt": "x", "top_k": -1}).args["top_k"] == 0


def test_a_request_reads_the_months_tokens_once_for_its_headers_and_first_check(api_tenant_a):
    """The token headers' figure is the monthly check of the request's first creation attempt
    (one read, not two); a try after waiting for a slot reads it afresh, and an allowance used
    up by then refuses the run."""
    from django.db import connection
    from django.test import RequestFactory
    from django.test.utils import CaptureQueriesContext

    from api.models import UsageRecord
    from api.serializers.openai import ChatCompletionSerializer
    from api.throttling import noted_tokens_used
    from api.views import openai as openai_views

    Plan.objects.filter(name=api_tenant_a.tenant.plan).update(tokens_per_month=100, max_concurrent_runs=10)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    request = RequestFactory().post(
        "/v1/chat/completions",
        json.dumps(body),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {api_tenant_a.key_secret}",
    )
    with CaptureQueriesContext(connection) as queries:
        key, parsed, plan = openai_views._admit(request, ChatCompletionSerializer)
        month = openai_views._first_try_only(noted_tokens_used(request))
        run = openai_views._start_once(key, parsed, plan, month())
    assert run is not None and request.symphony_tokens.remaining == 100
    month_reads = [q["sql"] for q in queries.captured_queries if 'FROM "api_monthlytokens"' in q["sql"]]
    assert len(month_reads) == 1, month_reads

    # Tokens used while the request waited: its next try reads them and is refused.
    UsageRecord.objects.create(tenant=api_tenant_a.tenant, prefill_tokens=60, decode_tokens=40)
    with pytest.raises(openai_views._Refused) as refused:
        openai_views._start_once(key, parsed, plan, month())
    assert refused.value.status == 429 and "monthly token quota" in str(refused.value.body)


def test_a_request_reads_its_tenants_plan_once(api_tenant_a):
    """Admission (stream cap), the token limit and the concurrency check under the tenant's lock
    all use the plan the request read first: each read was a query on the path of every answer."""
    from django.db import connection
    from django.test import RequestFactory
    from django.test.utils import CaptureQueriesContext

    from api.serializers.openai import ChatCompletionSerializer
    from api.views import openai as openai_views

    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    request = RequestFactory().post(
        "/v1/chat/completions",
        json.dumps(body),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {api_tenant_a.key_secret}",
    )
    with CaptureQueriesContext(connection) as queries:
        key, parsed, plan = openai_views._admit(request, ChatCompletionSerializer)
        run = openai_views._start_once(key, parsed, plan)
    assert run is not None and run.status == "queued"
    plan_reads = [q["sql"] for q in queries.captured_queries if 'FROM "api_plan"' in q["sql"]]
    assert len(plan_reads) == 1, plan_reads
