"""Property-based fuzzing of ``POST /v1/responses`` (a plain async view, outside the schema
fuzzer's reach), as tests/security/test_openai_fuzz.py does for the chat endpoints: bodies with
valid and broken fields and items, arbitrary JSON and non-JSON bytes, in-process through
Django's test client. The tenant is held at its concurrent-run limit, so a body that passes
validation is answered 429 by the quota check (no run, no worker); each such body is then
started for a second tenant inside a rolled-back savepoint, so it is really written as a run
and a stored response. Properties: never a 5xx; every error is OpenAI's envelope."""

from __future__ import annotations

import json
import time

import pytest
from django.db import transaction
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api import parsers
from api.serializers.responses import ResponseCreateSerializer
from api.services import responses
from tests.security.test_openai_fuzz import (  # noqa: F401
    ANY_JSON,
    _check_openai_error,
    _encode,
    refused_for_concurrency,
    saturated,
)

pytestmark = [pytest.mark.integration, pytest.mark.django_db, pytest.mark.timeout(300)]

MAX_EXAMPLES = 300
BUDGET_S = 40.0
PATH = "/v1/responses"

_text = st.text(st.characters(exclude_characters="\x00"), max_size=30)
_part = st.fixed_dictionaries({"type": st.sampled_from(["input_text", "output_text", "input_image"]), "text": _text})
_item = st.one_of(
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["system", "developer", "user", "assistant", "tool"]),
            "content": _text | st.lists(_part, max_size=3),
        }
    ),
    st.fixed_dictionaries(
        {"type": st.just("function_call"), "call_id": _text, "name": _text, "arguments": _text | ANY_JSON}
    ),
    st.fixed_dictionaries({"type": st.just("function_call_output"), "call_id": _text, "output": _text | ANY_JSON}),
    ANY_JSON,
)
_tool = st.fixed_dictionaries(
    {
        "type": st.sampled_from(["function", "web_search"]),
        "name": st.sampled_from(["get_weather", "f", "bad name"]),
        "parameters": st.just({"type": "object", "properties": {"city": {"type": "string"}}}) | ANY_JSON,
    }
)
_fields = {
    "instructions": _text | ANY_JSON,
    "previous_response_id": st.sampled_from(["resp_" + "0" * 32, "resp_x", "x"]) | ANY_JSON,
    "store": st.booleans() | ANY_JSON,
    "background": st.booleans(),
    "stream": st.booleans(),
    "tools": st.lists(_tool, max_size=3) | ANY_JSON,
    "tool_choice": st.sampled_from(["auto", "none", "required", {"type": "function", "name": "f"}]) | ANY_JSON,
    "parallel_tool_calls": st.booleans() | ANY_JSON,
    "max_output_tokens": st.integers(min_value=-5, max_value=10**12) | ANY_JSON,
    "temperature": st.floats(allow_nan=True, allow_infinity=True) | ANY_JSON,
    "top_p": st.floats(allow_nan=True, allow_infinity=True),
    "text": st.just({"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}}) | ANY_JSON,
    "metadata": st.dictionaries(_text, _text, max_size=3) | ANY_JSON,
    "truncation": st.sampled_from(["disabled", "auto"]),
    "include": st.just([]) | ANY_JSON,
    "reasoning": ANY_JSON,
}
BODIES = st.builds(
    lambda required, optional: {**required, **optional},
    st.fixed_dictionaries({"model": st.just("m"), "input": _text | st.lists(_item, min_size=0, max_size=4)}),
    st.fixed_dictionaries({}, optional=_fields),
)


class _RolledBack(Exception):
    pass


def _store(body: bytes, tenant) -> None:
    serializer = ResponseCreateSerializer(data=parsers.loads(body))
    assert serializer.is_valid(), (body, serializer.errors)
    try:
        with transaction.atomic():
            responses.start(tenant, None, responses.prepare(tenant, serializer))
            raise _RolledBack
    except _RolledBack:
        pass
    except (responses.NotFound, responses.Refused):
        pass


def test_responses_bodies_never_500_and_errors_use_openais_envelope(saturated, api_tenant_b):  # noqa: F811
    client = Client()
    auth = {"HTTP_AUTHORIZATION": f"Bearer {saturated.key_secret}"}
    statuses: dict[int | str, int] = {}
    deadline = time.monotonic() + BUDGET_S

    @settings(max_examples=MAX_EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(body=st.builds(_encode, BODIES, st.booleans()) | st.builds(_encode, ANY_JSON, st.booleans()) | st.binary())
    def run(body: bytes) -> None:
        if time.monotonic() > deadline:
            return
        response = client.post(PATH, body, content_type="application/json", **auth)
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        _check_openai_error(PATH, body, response)
        if refused_for_concurrency(response):
            statuses["concurrency"] = statuses.get("concurrency", 0) + 1
            _store(body, api_tenant_b.tenant)

    run()
    print(f"{PATH} status histogram: {statuses}")
    assert statuses.get(400, 0) >= 10 and statuses.get("concurrency", 0) >= 3, statuses
    assert json.dumps(statuses)
