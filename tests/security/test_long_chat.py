"""A chat too long for any context this deployment serves, through the real ASGI app.

A 3,000-message chat was accepted and became a run of the built-in LIP, which failed on the
worker (prompt past the model's length) and was answered 500; no bound said so up front. A
chat is now bounded by MAX_MESSAGES messages and MAX_PROMPT_CHARS characters of content in all,
refused with a 400 in OpenAI's error envelope naming ``messages``, before any run exists."""

from __future__ import annotations

import time

import httpx
import pytest

from api.models import Run
from api.serializers.openai import MAX_MESSAGES, MAX_PROMPT_CHARS, ChatCompletionSerializer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration, pytest.mark.timeout(120)]

CANARY_S = 5.0
#: Long enough for an answer that needs no worker; far too short for one that waits on a run.
ANSWER_S = 15.0


def _chat(messages: list[dict]) -> dict:
    return {"model": "m", "messages": messages}


@pytest.mark.parametrize(
    ("messages", "says"),
    [
        ([{"role": "user", "content": "hi"}] * 3_000, f"at most {MAX_MESSAGES} messages"),
        ([{"role": "user", "content": "x" * 2_000}] * 101, f"longer than {MAX_PROMPT_CHARS} characters"),
    ],
    ids=["3000 messages", "200k characters"],
)
def test_a_chat_past_its_bounds_is_a_400_before_any_run(api_asgi_server, api_tenant_a, api_tenant_b, messages, says):
    headers = {"Authorization": f"Bearer {api_tenant_a.key_secret}"}
    response = httpx.post(
        f"{api_asgi_server}/v1/chat/completions", json=_chat(messages), headers=headers, timeout=ANSWER_S
    )
    assert response.status_code == 400, response.text[:300]
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "messages", error
    assert says in error["message"]
    assert not Run.objects.filter(tenant=api_tenant_a.tenant).exists()

    started = time.monotonic()
    canary = httpx.get(f"{api_asgi_server}/v1/models", headers={"Authorization": f"Bearer {api_tenant_b.key_secret}"})
    assert canary.status_code == 200 and time.monotonic() - started < CANARY_S


def test_a_chat_at_its_bounds_is_valid():
    """The bounds refuse only what is past them."""
    at_count = ChatCompletionSerializer(data=_chat([{"role": "user", "content": "hi"}] * MAX_MESSAGES))
    assert at_count.is_valid(), at_count.errors
    per_message = MAX_PROMPT_CHARS // 100
    at_size = ChatCompletionSerializer(data=_chat([{"role": "user", "content": "x" * per_message}] * 100))
    assert at_size.is_valid(), at_size.errors
