"""A chat within the request bounds whose prompt still does not fit what the run may process,
through the whole real stack (uvicorn, Celery, gVisor sandbox, the worker on the tiny model).

900 short messages pass the serializer's bounds (api/serializers/openai.py) but tokenize to
more than the run's token budget (the plan's ``max_tokens_per_run``); the built-in LIP's first
``pred`` was refused (EDQUOT), the run failed, and the client got a 500 ``server_error`` with a
traceback. The LIP now reports the refusal and the API answers 400 ``context_length_exceeded``
(as a last error chunk when streaming), while another tenant's chat is answered meanwhile."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.plugins.worker import RunningWorker

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.integration,
    pytest.mark.docker,
    pytest.mark.vllm,
    pytest.mark.timeout(300),
]

LONG = [{"role": "user", "content": "hello there"}] * 900
SHORT = [{"role": "user", "content": "Say hi."}]
CANARY_S = 120.0


@pytest.fixture(scope="module")
def stack_worker(shared_stack_worker: RunningWorker) -> RunningWorker:
    return shared_stack_worker


def _post(stack: str, secret: str, body: dict) -> httpx.Response:
    headers = {"Authorization": f"Bearer {secret}"}
    return httpx.post(f"{stack}/v1/chat/completions", json=body, headers=headers, timeout=180)


def test_a_prompt_past_the_runs_budget_is_a_400_not_a_failed_run(stack, api_tenant_a, api_tenant_b):
    plain = _post(stack, api_tenant_a.key_secret, {"model": "m", "max_tokens": 4, "messages": LONG})
    assert plain.status_code == 400, plain.text[:500]
    error = plain.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "context_length_exceeded", error
    assert error["param"] == "messages" and "tokens" in error["message"], error

    streamed = _post(stack, api_tenant_a.key_secret, {"model": "m", "max_tokens": 4, "stream": True, "messages": LONG})
    assert streamed.status_code == 200
    events = [line[len("data: ") :] for line in streamed.text.splitlines() if line.startswith("data: ")]
    assert json.loads(events[-1])["error"]["code"] == "context_length_exceeded", events[-1]

    started = time.monotonic()
    canary = _post(stack, api_tenant_b.key_secret, {"model": "m", "max_tokens": 4, "messages": SHORT})
    assert canary.status_code == 200, canary.text[:500]
    assert canary.json()["choices"][0]["message"]["role"] == "assistant"
    assert time.monotonic() - started < CANARY_S


def test_a_completion_past_the_runs_budget_ends_at_length_not_a_500(stack, api_tenant_a):
    """The prompt fits the run's token budget (the plan's tokens per run) but prompt +
    ``max_tokens`` does not: the answer stops where the budget does, ``finish_reason`` is
    ``length`` (streamed: the last chunk says so and ``[DONE]`` follows), never a 500 after the
    tokens were computed (which the ``openai`` client then retried twice)."""
    from api.models import Plan

    Plan.objects.update_or_create(name=api_tenant_a.tenant.plan, defaults={"max_tokens_per_run": 300})
    body = {"model": "m", "max_tokens": 400, "messages": LONG[:30], "temperature": 0, "ignore_eos": True}
    plain = _post(stack, api_tenant_a.key_secret, body)
    assert plain.status_code == 200, plain.text[:500]
    answer = plain.json()
    usage = answer["usage"]
    assert answer["choices"][0]["finish_reason"] == "length", answer
    # The last token is chosen by the last forward the budget allowed and never fed back, so it
    # costs no token of the budget: prompt + completion is at most the budget plus that one.
    assert 0 < usage["completion_tokens"] < 400 and usage["prompt_tokens"] + usage["completion_tokens"] <= 301, usage

    streamed = _post(stack, api_tenant_a.key_secret, {**body, "stream": True})
    assert streamed.status_code == 200
    events = [line[len("data: ") :] for line in streamed.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]", events[-3:]
    finishes = [c["finish_reason"] for e in events[:-1] for c in json.loads(e).get("choices", [])]
    assert finishes[-1] == "length" and "error" not in streamed.text, events[-3:]
