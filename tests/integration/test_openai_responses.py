"""``/v1/responses`` through real clients (the ``openai`` client, the OpenAI Agents SDK's default
Responses model) against the whole real stack: uvicorn, Celery, gVisor, the worker on the real
default model. Covers text, streaming with the Responses event types, a function tool round
trip, ``previous_response_id`` continuing a conversation on its kept KV (and recomputing it
once that KV is gone), retrieve / delete / cancel, tenancy and bad input."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.openai_support import WEATHER_FUNCTION, openai_client, valid_weather
from tests.plugins.worker import RunningWorker, start_worker

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.integration,
    pytest.mark.docker,
    pytest.mark.vllm,
    pytest.mark.timeout(900),
]

WEATHER = {"type": "function", **WEATHER_FUNCTION}
BRIEF = "Answer in one short sentence."
LAZY_WRITE_S = 30


@pytest.fixture(scope="module")
def stack_worker(default_model_dir: Path) -> Iterator[RunningWorker]:
    # Conversation files are written to the store once idle this long (durable=False files):
    # long enough for the checks that a turn's close writes nothing, short enough to see it written.
    lazy = ["--kv-lazy-write-s", str(LAZY_WRITE_S)]
    with start_worker(default_model_dir, dtype="float32", name="responses", extra_args=lazy) as worker:
        yield worker


@pytest.fixture
def patient_plan(api_tenant_a):
    """Runs may take longer than the free plan's minute: the test machine's CPUs are shared."""
    from api.models import Plan

    Plan.objects.filter(name=api_tenant_a.tenant.plan).update(max_run_seconds=300)


def test_responses_with_the_openai_client(stack, stack_worker, api_tenant_a, api_tenant_b, settings, patient_plan):
    import openai

    from api.models import KVFile, Run, StoredResponse
    from api.services import responses

    client = openai_client(stack, api_tenant_a.key_secret)
    slug = api_tenant_a.tenant.slug

    # Text.
    first = client.responses.create(
        model="any", instructions=BRIEF, input="What is the capital of France?", max_output_tokens=16, temperature=0
    )
    assert first.id.startswith("resp_") and first.status in ("completed", "incomplete"), first
    assert first.output_text and first.output[0].type == "message", first
    assert first.usage.input_tokens > 0 and first.usage.output_tokens > 0, first.usage
    # The conversation's KV file is not written through to the KV store at the turn's close.
    blob = Path(stack_worker.kv_store) / slug / f"resp-{first.id[len('resp_') :]}.safetensors"
    assert not blob.exists()

    # Streamed: the Responses event types, the deltas adding up to the same (greedy) answer.
    events = list(
        client.responses.create(
            model="any",
            instructions=BRIEF,
            input="What is the capital of France?",
            max_output_tokens=16,
            temperature=0,
            stream=True,
        )
    )
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"], kinds
    assert kinds[-1] in ("response.completed", "response.incomplete"), kinds
    for kind in ("output_item.added", "content_part.added", "output_text.done", "content_part.done"):
        assert f"response.{kind}" in kinds, kinds
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == events[-1].response.output_text == first.output_text, (deltas, first.output_text)

    # The conversation's KV is kept as the tenant's KV file (billed as KV storage: mirrored).
    name = f"resp-{first.id[len('resp_') :]}"
    assert name in {f["name"] for f in stack_worker.admin.kv_list(slug)}
    assert KVFile.objects.filter(tenant=api_tenant_a.tenant, name=name).exists()

    # A follow-up prefills only the new input: the first turn's prompt comes from the file.
    second = client.responses.create(
        model="any",
        instructions=BRIEF,
        input="And of Germany?",
        previous_response_id=first.id,
        max_output_tokens=16,
        temperature=0,
    )
    cached = second.usage.input_tokens_details.cached_tokens
    assert cached >= first.usage.input_tokens, (cached, first.usage)
    assert second.usage.input_tokens > cached and second.previous_response_id == first.id
    assert second.output_text, second
    # Idle for the worker's lazy-write time, it is written (and a worker crash loses nothing).
    deadline = time.monotonic() + LAZY_WRITE_S + 60
    while not blob.exists() and time.monotonic() < deadline:
        time.sleep(1)
    assert blob.exists()

    # The KV gone (the TTL sweep past its expiry): the follow-up is recomputed from the rows.
    settings.SYMPHONY_WORKER_ADMIN_SOCKET = stack_worker.admin_socket
    StoredResponse.objects.filter(kv_name=name).update(kv_expires_at="2000-01-01T00:00:00Z")
    assert responses.expire_kv() == 1
    assert name not in {f["name"] for f in stack_worker.admin.kv_list(slug)}
    again = client.responses.create(
        model="any",
        instructions=BRIEF,
        input="And of Germany?",
        previous_response_id=first.id,
        max_output_tokens=16,
        temperature=0,
    )
    # The same prompt, rebuilt from the stored items (what the worker's prefix cache still holds
    # of it may count as cached: that cache is the tenant's, and never changes the answer).
    assert again.usage.input_tokens == second.usage.input_tokens and again.output_text, again
    assert again.usage.input_tokens_details.cached_tokens <= again.usage.input_tokens, again.usage

    # A function tool round trip: a forced call (valid JSON for its schema), its output back.
    called = client.responses.create(
        model="any",
        input="What is the weather in Paris?",
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,  # one call: quick on a loaded CPU (runs have a minute)
        max_output_tokens=60,
        temperature=0,
    )
    calls = [item for item in called.output if item.type == "function_call"]
    assert calls and calls[0].name == "get_weather" and calls[0].call_id.startswith("call_"), called.output
    valid_weather(calls[0].arguments)
    stored = client.responses.retrieve(called.id)
    assert [i.model_dump() for i in stored.output] == [i.model_dump() for i in called.output]
    answered = client.responses.create(
        model="any",
        previous_response_id=called.id,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": '{"temperature": 21}'}],
        tools=[WEATHER],
        tool_choice="none",
        max_output_tokens=12,
        temperature=0,
    )
    assert answered.output_text and not [i for i in answered.output if i.type == "function_call"], answered
    assert answered.usage.input_tokens_details.cached_tokens > 0, answered.usage

    # Streamed call: the arguments events carry the same (greedy) call.
    streamed = list(
        client.responses.create(
            model="any",
            input="What is the weather in Paris?",
            tools=[WEATHER],
            tool_choice={"type": "function", "name": "get_weather"},
            parallel_tool_calls=False,
            max_output_tokens=60,
            temperature=0,
            stream=True,
        )
    )
    done = [e for e in streamed if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1 and done[0].arguments == calls[0].arguments, done
    assert streamed[-1].type == "response.completed"
    assert streamed[-1].response.output[-1].type == "function_call"

    # Retrieve, input items, delete.
    assert client.responses.retrieve(first.id).output_text == first.output_text
    items = client.responses.input_items.list(first.id)
    assert [i.type for i in items.data] == ["message"], items
    client.responses.delete(again.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(again.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="any", input="hi", previous_response_id=again.id)

    # Background, then cancelled (or already done): it settles either way; only background
    # responses can be cancelled.
    background = client.responses.create(
        model="any", input="Count from one to one hundred.", max_output_tokens=200, background=True
    )
    assert background.status in ("queued", "in_progress"), background
    cancelled = client.responses.cancel(background.id)
    deadline = time.monotonic() + 120
    while cancelled.status in ("queued", "in_progress") and time.monotonic() < deadline:
        time.sleep(0.5)
        cancelled = client.responses.retrieve(background.id)
    assert cancelled.status in ("cancelled", "completed", "incomplete"), cancelled
    with pytest.raises(openai.BadRequestError):
        client.responses.cancel(first.id)

    # store=false: answered, not kept.
    unstored = client.responses.create(model="any", input="Say hi.", store=False, max_output_tokens=4)
    assert unstored.output_text is not None and unstored.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)

    # Another tenant's ids are unknown to this one: 404 in OpenAI's envelope.
    other = openai_client(stack, api_tenant_b.key_secret)
    with pytest.raises(openai.NotFoundError) as foreign:
        other.responses.retrieve(first.id)
    assert foreign.value.body["code"] == "not_found", foreign.value.body
    with pytest.raises(openai.NotFoundError):
        other.responses.create(model="any", input="hi", previous_response_id=first.id)
    with pytest.raises(openai.NotFoundError):
        other.responses.delete(first.id)

    # A tenant whose stored-KV budget is spent still gets its answers (the turn goes on in a
    # private KV); its follow-ups are recomputed.
    from api.models import Plan

    Plan.objects.filter(name=api_tenant_b.tenant.plan).update(kv_bytes_stored=1)
    tight = other.responses.create(model="any", input="Say hi.", max_output_tokens=6, temperature=0)
    assert tight.status in ("completed", "incomplete") and tight.output_text, tight
    follow = other.responses.create(
        model="any", input="Again.", previous_response_id=tight.id, max_output_tokens=6, temperature=0
    )
    assert follow.output_text and follow.usage.input_tokens > tight.usage.input_tokens, follow.usage
    Plan.objects.filter(name=api_tenant_b.tenant.plan).update(kv_bytes_stored=None)

    # Malformed items and parameters not honoured: 400 naming them, nothing run.
    runs = Run.objects.count()
    for bad, param in (
        ({"input": [{"type": "image", "url": "x"}]}, "input"),
        ({"input": [{"role": "wizard", "content": "x"}]}, "input"),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "input"),
        ({"input": "hi", "extra_body": {"reasoning": {"effort": "high"}}}, "reasoning"),
        ({"input": "hi", "tool_choice": "required"}, "tool_choice"),
    ):
        with pytest.raises(openai.BadRequestError) as refused:
            client.responses.create(model="any", **bad)
        assert refused.value.body["param"] == param, (bad, refused.value.body)
    assert Run.objects.count() == runs

    # A tool schema the grammar compiler refuses: a 400 naming tools (the run bills what ran).
    broken = {"type": "function", "name": "f", "parameters": {"properties": {"x": {"$ref": "#/nope"}}}}
    with pytest.raises(openai.BadRequestError) as uncompilable:
        client.responses.create(model="any", input="hi", tools=[broken], tool_choice="required")
    assert uncompilable.value.body["param"] == "tools", uncompilable.value.body
    failed = list(client.responses.create(model="any", input="hi", tools=[broken], tool_choice="required", stream=True))
    assert failed[-1].type == "response.failed" and failed[-1].response.status == "failed", failed[-1]
    assert "grammar" in failed[-1].response.error.message, failed[-1].response.error


def test_vllm_sampling_extras_and_nul_characters_on_responses(stack, api_tenant_a, patient_plan):
    """What ``vllm bench serve``'s ``openai-responses`` backend sends: ``ignore_eos`` (the answer
    runs to ``max_output_tokens``), ``store: false``, prompts with U+0000 (its random dataset);
    ``min_tokens`` bars the end of the answer until then, as on the chat endpoint."""
    client = openai_client(stack, api_tenant_a.key_secret)
    short = "Reply with the single word: yes"
    plain = client.responses.create(model="any", input=short, max_output_tokens=64, temperature=0)
    assert plain.status == "completed", plain  # ended by EOS before the limit
    least = plain.usage.output_tokens + 6
    longer = client.responses.create(
        model="any", input=short, max_output_tokens=least + 16, temperature=0, extra_body={"min_tokens": least}
    )
    assert longer.usage.output_tokens >= least, longer.usage
    forced = list(
        client.responses.create(
            model="any",
            input="The end.\x00",
            max_output_tokens=24,
            temperature=0,
            stream=True,
            store=False,
            extra_body={"ignore_eos": True},
        )
    )
    done = forced[-1].response
    assert done.status == "incomplete" and done.usage.output_tokens == 24, done
    assert done.usage.input_tokens > 0


def test_agents_sdk_default_responses_model_calls_a_local_tool(stack, api_tenant_a, patient_plan):
    from agents import (
        Agent,
        ModelSettings,
        Runner,
        function_tool,
        set_default_openai_api,
        set_default_openai_client,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    set_default_openai_api("responses")
    set_default_openai_client(
        AsyncOpenAI(base_url=f"{stack}/v1", api_key=api_tenant_a.key_secret, max_retries=0), use_for_tracing=False
    )
    seen: list[str] = []

    @function_tool
    def lookup_weather(city: str) -> str:
        """Current weather in a city."""
        seen.append(city)
        return f"sunny in {city}"

    agent = Agent(
        name="weather",
        instructions="Use the tool to answer.",
        model="any",
        tools=[lookup_weather],
        # One call (not parallel ones up to the token limit): quick on a loaded CPU.
        model_settings=ModelSettings(tool_choice="required", max_tokens=60, temperature=0, parallel_tool_calls=False),
        tool_use_behavior="stop_on_first_tool",
    )
    outcome = Runner.run_sync(agent, "What is the weather in Paris?", max_turns=3)
    assert len(seen) >= 1 and outcome.final_output == f"sunny in {seen[0]}", (seen, outcome.final_output)
