"""Property-based fuzzing of the OpenAI-compatible endpoints, which the schema-driven fuzzer
(test_api_fuzz.py) cannot reach: they are plain async views outside the OpenAPI schema.

Hypothesis builds valid request bodies and breaks none, one or two of their fields (dropped, a
value at or past the field's edge, or arbitrary JSON: NaN, infinities and numbers like 1e400
included, which Python's json module reads), plus bodies that are not objects or not JSON at
all. Requests go in-process through Django's test client to the real views, serializers and
run-creation service on the test database. The tenant is kept at its plan's concurrent-run
limit, so a body that passes validation reaches the quota check and is answered 429 there
instead of starting a run (nothing is enqueued, no worker is needed). Each such body is then
also started for a second tenant with room, inside a savepoint that is rolled back: the run row
is really written to PostgreSQL, which is where a NaN once turned into a 500.

Properties, for every response: never a 5xx, and the body is OpenAI's error envelope
``{"error": {"message": str, "type": str, "param", "code"}}``, which the ``openai`` client turns
into typed exceptions; every accepted body can be stored as a run.
"""

from __future__ import annotations

import json
import math
import time

import pytest
from django.db import transaction
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api import parsers
from api.models import Plan, Program
from api.serializers.openai import ChatCompletionSerializer, CompletionSerializer
from api.services import openai_requests, programs
from api.services.runs import create_run

pytestmark = [pytest.mark.integration, pytest.mark.django_db, pytest.mark.timeout(300)]

MAX_EXAMPLES = 300
BUDGET_S = 40.0

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
)
ANY_JSON = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


_text = st.text(st.characters(exclude_characters="\x00"), max_size=30)
_message = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["system", "user", "assistant", "tool"]),
        "content": _text | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": _text}), max_size=3),
    }
)
#: Values each field accepts (what a well-behaved client sends).
VALID = {
    "model": _text.filter(bool),
    "messages": st.lists(_message, min_size=1, max_size=3),
    "prompt": _text.filter(bool),
    "max_tokens": st.integers(min_value=1, max_value=2**40),
    "max_completion_tokens": st.integers(min_value=1, max_value=2**40),
    "temperature": st.floats(min_value=0, max_value=2),
    "top_p": st.floats(min_value=0, max_value=1),
    "n": st.integers(min_value=1, max_value=8),
    "stop": _text.filter(bool) | st.lists(_text.filter(bool), max_size=4),
    "seed": st.integers(min_value=0, max_value=2**31),
    "stream": st.booleans(),
    "stream_options": st.none() | st.fixed_dictionaries({}, optional={"include_usage": st.booleans()}),
    "top_k": st.integers(min_value=-1, max_value=100),
    "min_p": st.floats(min_value=0, max_value=1),
    "presence_penalty": st.floats(min_value=-2, max_value=2),
    "frequency_penalty": st.floats(min_value=-2, max_value=2),
    "logit_bias": st.dictionaries(st.integers(0, 50_000).map(str), st.floats(-100, 100), max_size=3),
    "stop_token_ids": st.lists(st.integers(0, 50_000), max_size=3),
    "ignore_eos": st.booleans(),
    "min_tokens": st.integers(0, 8),
    "user": _text,
    "tools": st.lists(
        st.fixed_dictionaries(
            {
                "type": st.just("function"),
                "function": st.fixed_dictionaries(
                    {"name": st.from_regex(r"[a-z_]{1,12}", fullmatch=True)},
                    optional={"parameters": st.dictionaries(_text, ANY_JSON, max_size=3)},
                ),
            }
        ),
        max_size=2,
    ),
    "tool_choice": st.sampled_from(["none", "auto", "required", {"type": "function", "function": {"name": "f"}}]),
    "response_format": st.sampled_from([{"type": "text"}, {"type": "json_object"}])
    | st.fixed_dictionaries(
        {
            "type": st.just("json_schema"),
            "json_schema": st.fixed_dictionaries({"schema": st.dictionaries(_text, ANY_JSON, max_size=3)}),
        }
    ),
}
#: Values near or past each field's edge, and values of the wrong type.
EDGES = {
    "temperature": st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 2.0000001, -1e-300]),
    "top_p": st.sampled_from([math.nan, math.inf, 1.0000001, -0.0]),
    "n": st.sampled_from([0, 9, -1, 2**64, 1.5, True]),
    "max_tokens": st.sampled_from([0, -1, 2**63, 2**64, 10**30, 1.0, "10", True]),
    "seed": st.sampled_from([-1, 2**31 + 1, 2**64, 1.5, "7"]),
    "stop": st.sampled_from(["", [""], ["a"] * 5, [1], "a\x00b", ["\ud83d"]]),
    "messages": st.sampled_from([[], [{}], [{"role": "user"}], [{"role": "user", "content": None}]]),
    "model": st.sampled_from(["", "m" * 201, None, "a\x00", "\ud800"]),
    "prompt": st.sampled_from(["", "\udfff", "a\x00", "p" * 200_001, ["a"]]),
    "response_format": st.sampled_from(
        [
            {"type": "json_schema", "json_schema": {"schema": {"type": "number", "maximum": math.inf}}},
            {"type": "json_schema", "json_schema": {"schema": {"enum": [math.nan]}}},
            {"type": "json_schema", "json_schema": {"schema": {"a\x00": {}}}},
            {"type": "json_schema", "json_schema": {"schema": []}},
            {"type": "json_object", "json_schema": None},
        ]
    ),
}


def _body(required: tuple[str, ...], optional: tuple[str, ...]) -> st.SearchStrategy:
    """A valid body with nothing, one or two of its fields broken (dropped, an edge value, or
    arbitrary JSON): most examples then fail on one field at a time, and some pass."""
    valid = st.fixed_dictionaries(
        {name: VALID[name] for name in required}, optional={name: VALID[name] for name in optional}
    )
    names = st.sampled_from(required + optional)

    @st.composite
    def broken(draw) -> dict:
        body = draw(valid)
        for _ in range(draw(st.integers(min_value=0, max_value=2))):
            name = draw(names)
            how = draw(st.sampled_from(["drop", "edge", "any"]))
            if how == "drop":
                body.pop(name, None)
            elif how == "edge" and name in EDGES:
                body[name] = draw(EDGES[name])
            else:
                body[name] = draw(ANY_JSON)
        return body

    return broken()


OPTIONAL = (
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "n",
    "stop",
    "seed",
    "stream",
    "response_format",
)
SAMPLING = (
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "stop_token_ids",
    "ignore_eos",
    "min_tokens",
    "user",
)
SHAPES = {
    "/v1/chat/completions": _body(("model", "messages"), (*OPTIONAL, *SAMPLING, "tools", "tool_choice")),
    "/v1/completions": _body(("model", "prompt"), (*OPTIONAL, *SAMPLING)),
}


def _encode(value: object, huge: bool) -> bytes:
    """JSON text of ``value``; with ``huge``, infinities written as ``1e400`` (a number literal
    that parses to inf, where ``Infinity`` is a constant strict parsers refuse)."""
    text = json.dumps(value)
    return (text.replace("-Infinity", "-1e400").replace("Infinity", "1e400") if huge else text).encode()


def _bodies(path: str) -> st.SearchStrategy[bytes]:
    return (
        st.builds(_encode, SHAPES[path], st.booleans())
        | st.builds(_encode, ANY_JSON, st.booleans())
        | st.binary(max_size=64)
    )


class _RolledBack(Exception):
    pass


def _store_as_run(path: str, body: bytes, tenant) -> None:
    """Start what the endpoint accepted as a run of ``tenant`` (real insert), then roll it back."""
    serializer_class = ChatCompletionSerializer if path == "/v1/chat/completions" else CompletionSerializer
    serializer = serializer_class(data=parsers.loads(body))
    assert serializer.is_valid(), (body, serializer.errors)
    try:
        with transaction.atomic():
            openai_requests.start(tenant, None, serializer.to_completion_request())
            raise _RolledBack
    except _RolledBack:
        pass


@pytest.fixture
def saturated(api_tenant_a, settings):
    """Tenant A at its plan's concurrent-run limit: a valid request ends at the quota check
    (at once: no queueing for a slot)."""
    settings.SYMPHONY_OPENAI_QUEUE_S = 0
    plan = Plan.objects.get(name=api_tenant_a.tenant.plan)
    prog = Program.objects.create(tenant=api_tenant_a.tenant, name="holder")
    programs.add_version(prog, "p.py", b"def main(a):\n    return 1\n")
    for _ in range(plan.max_concurrent_runs):
        create_run(api_tenant_a.tenant, prog, None, {}, {})
    return api_tenant_a


def refused_for_concurrency(response) -> bool:
    """A 429 of the plan's concurrent-run limit, where the saturated tenant's valid bodies end;
    not one of the tenant's request rate (thousands of examples a minute go past it, and that
    refusal comes before validation, so its body may be anything)."""
    if response.status_code != 429:
        return False
    return "as many requests as its plan allows" in json.loads(response.content)["error"]["message"]


def _check_openai_error(path: str, body: bytes, response) -> None:
    where = f"POST {path} body={body[:300]!r}"
    assert response.status_code < 500, f"{response.status_code} for {where}: {response.content[:1000]!r}"
    assert 400 <= response.status_code < 500, (where, response.status_code)
    payload = json.loads(response.content)
    error = payload.get("error") if isinstance(payload, dict) else None
    assert isinstance(error, dict) and set(error) == {"message", "type", "param", "code"}, (where, payload)
    assert isinstance(error["message"], str) and isinstance(error["type"], str), (where, payload)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_openai_bodies_never_500_and_errors_use_openais_envelope(saturated, api_tenant_b, path):
    client = Client()
    auth = {"HTTP_AUTHORIZATION": f"Bearer {saturated.key_secret}"}
    statuses: dict[int | str, int] = {}
    deadline = time.monotonic() + BUDGET_S

    @settings(max_examples=MAX_EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(body=_bodies(path))
    def run(body: bytes) -> None:
        if time.monotonic() > deadline:
            return
        response = client.post(path, body, content_type="application/json", **auth)
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        _check_openai_error(path, body, response)
        if refused_for_concurrency(response):
            statuses["concurrency"] = statuses.get("concurrency", 0) + 1
            _store_as_run(path, body, api_tenant_b.tenant)

    run()
    print(f"{path} status histogram: {statuses}")
    # Both halves were exercised: bodies refused by validation, and bodies that passed it and
    # reached the run service (refused there by the quota, on purpose).
    assert statuses.get(400, 0) >= 10 and statuses.get("concurrency", 0) >= 3, statuses


MINIMAL = {
    "/v1/chat/completions": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    "/v1/completions": {"model": "m", "prompt": "hi"},
}


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_every_edge_value_of_every_field_is_answered_and_storable(saturated, api_tenant_b, path):
    """The edge values above, each alone in an otherwise minimal body, in both spellings of an
    infinity: a draw of the fuzzer above meets a given one only now and then."""
    client = Client()
    auth = {"HTTP_AUTHORIZATION": f"Bearer {saturated.key_secret}"}
    for field, values in EDGES.items():
        for value in values.wrapped_strategy.elements if hasattr(values, "wrapped_strategy") else values.elements:
            for huge in (False, True):
                body = _encode({**MINIMAL[path], field: value}, huge)
                response = client.post(path, body, content_type="application/json", **auth)
                _check_openai_error(path, body, response)
                if response.status_code == 429:
                    _store_as_run(path, body, api_tenant_b.tenant)
