"""Real OpenAI clients as black boxes against the whole real stack (uvicorn, Celery, gVisor,
the worker on the real default model): the ``openai`` client, LangChain (``langchain-openai``),
litellm and the OpenAI Agents SDK, each used as its own documentation says.

Tool calls are generated under a grammar built from the tools' schemas, so even a 135M model
returns calls whose arguments parse and match their function's parameters; these tests force
calls (``required`` / a named tool) where the model's own choice would make them flaky.
"""

from __future__ import annotations

import pytest

from tests.integration.openai_support import WEATHER_FUNCTION, openai_client, valid_weather
from tests.plugins.worker import RunningWorker

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.integration,
    pytest.mark.docker,
    pytest.mark.vllm,
    pytest.mark.timeout(600),
]

WEATHER = {"type": "function", "function": WEATHER_FUNCTION}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def stack_worker(shared_real_model_worker: RunningWorker) -> RunningWorker:
    """The worker on the real default model in float32 (so transformers can be matched exactly)."""
    return shared_real_model_worker


def test_openai_client_tools_logprobs_and_sampling_parameters(stack, api_tenant_a, default_model_dir):
    import openai

    client = openai_client(stack, api_tenant_a.key_secret)
    forced = client.chat.completions.create(
        model="any", messages=QUESTION, tools=[WEATHER], tool_choice="required", max_tokens=60, temperature=0
    )
    choice = forced.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls, choice
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    valid_weather(call.function.arguments)

    # Streamed: the same call (greedy), as tool-call deltas the client accumulates by index.
    chunks = list(
        client.chat.completions.create(
            model="any",
            messages=QUESTION,
            tools=[WEATHER],
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            parallel_tool_calls=False,
            max_tokens=60,
            temperature=0,
            stream=True,
        )
    )
    deltas = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert len(deltas) == 1 and deltas[0].function.arguments == call.function.arguments, deltas
    assert chunks[-1].choices[0].finish_reason == "tool_calls"

    # The loop continues: the assistant's call (content null) and the tool's answer go back.
    follow = client.chat.completions.create(
        model="any",
        messages=[
            {"role": "developer", "content": "Answer briefly."},
            *QUESTION,
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21, "sky": "clear"}'},
        ],
        tools=[WEATHER],
        tool_choice="none",
        max_tokens=12,
        temperature=0,
    )
    assert follow.choices[0].message.content and not follow.choices[0].message.tool_calls, follow

    # logprobs: one entry a generated token; greedy picks the most likely token.
    scored = client.chat.completions.create(
        model="any", messages=QUESTION, max_tokens=5, temperature=0, logprobs=True, top_logprobs=3
    )
    content = scored.choices[0].logprobs.content
    assert len(content) == scored.usage.completion_tokens and all(len(e.top_logprobs) == 3 for e in content)
    for entry in content:
        assert entry.logprob <= 0 and abs(entry.top_logprobs[0].logprob - entry.logprob) < 1e-3, entry
    assert "".join(e.token for e in content) == scored.choices[0].message.content

    # logit_bias -100 on the greedy first token: another first token.
    first = content[0]
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(default_model_dir))  # the served model's
    token_id = tokenizer.encode(first.token, add_special_tokens=False)[0]
    banned = client.chat.completions.create(
        model="any", messages=QUESTION, max_tokens=5, temperature=0, logprobs=True, logit_bias={str(token_id): -100}
    )
    assert banned.choices[0].logprobs.content[0].token != first.token, banned

    # Penalties, top_k, min_p and stop_token_ids are accepted and run.
    for extra in ({"presence_penalty": 1.5, "frequency_penalty": 1.0}, {"top_k": 1}, {"min_p": 0.5}):
        kwargs = {k: v for k, v in extra.items() if k in ("presence_penalty", "frequency_penalty")}
        body = {k: v for k, v in extra.items() if k not in kwargs}
        done = client.chat.completions.create(
            model="any", messages=QUESTION, max_tokens=6, temperature=0.8, seed=3, extra_body=body, **kwargs
        )
        assert done.choices[0].message.content, extra
    stopped = client.chat.completions.create(
        model="any", messages=QUESTION, max_tokens=8, temperature=0, extra_body={"stop_token_ids": [token_id]}
    )
    assert stopped.choices[0].finish_reason == "stop" and stopped.usage.completion_tokens == 0, stopped

    # Completions: a list of prompts, echo with logprobs.
    listed = client.completions.create(
        model="any", prompt=["1, 2, 3,", "a, b, c,"], max_tokens=4, temperature=0, echo=True, logprobs=2
    )
    assert [c.index for c in listed.choices] == [0, 1]
    assert listed.choices[0].text.startswith("1, 2, 3,") and listed.choices[1].text.startswith("a, b, c,")
    lp = listed.choices[0].logprobs
    assert lp.token_logprobs[0] is None and len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset)
    assert "".join(lp.tokens) == listed.choices[0].text

    # auto: the model writes text or calls; whichever it chose is well-formed.
    chosen = client.chat.completions.create(
        model="any", messages=QUESTION, tools=[WEATHER], max_tokens=60, temperature=0
    )
    for auto_call in chosen.choices[0].message.tool_calls or []:
        valid_weather(auto_call.function.arguments)
    assert chosen.choices[0].message.content or chosen.choices[0].message.tool_calls, chosen

    # A tool schema the grammar compiler refuses: a 400 naming tools.
    broken = {"type": "function", "function": {"name": "f", "parameters": {"properties": {"x": {"$ref": "#/nope"}}}}}
    with pytest.raises(openai.BadRequestError) as uncompilable:
        client.chat.completions.create(model="any", messages=QUESTION, tools=[broken], tool_choice="required")
    assert uncompilable.value.body["param"] == "tools", uncompilable.value.body

    # Not honoured: a 400 naming it, nothing run.
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="any", messages=QUESTION, extra_body={"guided_regex": "a+"})
    assert refused.value.body["param"] == "guided_regex"
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="any", input="x")
    assert client.models.retrieve(client.models.list().data[0].id).object == "model"


def test_langchain_litellm_and_the_agents_sdk(stack, api_tenant_a, monkeypatch):
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel, Field

    llm = ChatOpenAI(
        model="any",
        base_url=f"{stack}/v1",
        api_key=api_tenant_a.key_secret,
        temperature=0,
        max_tokens=40,
        max_retries=0,
    )
    answer = llm.invoke("What is the capital of France?")
    assert "Paris" in answer.content, answer
    streamed = "".join(chunk.content for chunk in llm.stream("What is the capital of France?"))
    assert streamed == answer.content

    @tool
    def get_weather(city: str, unit: str) -> str:
        """Current weather in a city; unit is c or f."""
        return f"21{unit} in {city}"

    with_tools = llm.bind_tools([get_weather], tool_choice="get_weather")
    message = with_tools.invoke("What is the weather in Paris?")
    assert message.tool_calls and message.tool_calls[0]["name"] == "get_weather", message
    assert set(message.tool_calls[0]["args"]) == {"city", "unit"}
    result = get_weather.invoke(message.tool_calls[0])
    assert "in" in result.content

    class Place(BaseModel):
        """A city and its country."""

        city: str = Field(max_length=24)
        country: str = Field(max_length=24)

    place = llm.with_structured_output(Place, method="function_calling").invoke("Name a city and its country.")
    assert isinstance(place, Place) and place.city and place.country, place

    # litellm, as an OpenAI-compatible provider.
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    reply = litellm.completion(
        model="openai/any",
        api_base=f"{stack}/v1",
        api_key=api_tenant_a.key_secret,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=12,
        temperature=0,
    )
    assert "Paris" in reply.choices[0].message.content, reply
    called = litellm.completion(
        model="openai/any",
        api_base=f"{stack}/v1",
        api_key=api_tenant_a.key_secret,
        messages=QUESTION,
        tools=[WEATHER],
        tool_choice="required",
        max_tokens=60,
    )
    valid_weather(called.choices[0].message.tool_calls[0].function.arguments)

    # The Agents SDK (chat-completions model): the agent calls a local function tool.
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    seen: list[str] = []

    @function_tool
    def lookup_weather(city: str) -> str:
        """Current weather in a city."""
        seen.append(city)
        return f"sunny in {city}"

    model = OpenAIChatCompletionsModel(
        model="any", openai_client=AsyncOpenAI(base_url=f"{stack}/v1", api_key=api_tenant_a.key_secret, max_retries=0)
    )
    agent = Agent(
        name="weather",
        instructions="Use the tool to answer.",
        model=model,
        tools=[lookup_weather],
        model_settings=ModelSettings(tool_choice="required", max_tokens=60, temperature=0),
        tool_use_behavior="stop_on_first_tool",
    )
    outcome = Runner.run_sync(agent, "What is the weather in Paris?", max_turns=3)
    assert len(seen) >= 1 and outcome.final_output == f"sunny in {seen[0]}", (seen, outcome.final_output)


def test_fused_decode_chooses_what_the_distribution_path_chooses(stack, api_tenant_a):
    """Without logprobs or min-p the built-in program lets the worker choose each token inside
    its ``pred`` and streams text from a second thread; asking for logprobs takes the path that
    chooses from a Dist handle. Same seed, same tokens, same text, streamed or not, with and
    without penalties (their bias is rebuilt each step from the counts)."""
    client = openai_client(stack, api_tenant_a.key_secret)
    prompt = [{"role": "user", "content": "Write a short story about a lighthouse."}]
    cases = [
        {"temperature": 0},
        {"temperature": 0.9, "seed": 7},
        {"temperature": 0.9, "seed": 11, "presence_penalty": 1.2, "frequency_penalty": 0.8},
    ]
    for params in cases:
        fused = client.chat.completions.create(model="any", messages=prompt, max_tokens=24, **params)
        by_dist = client.chat.completions.create(model="any", messages=prompt, max_tokens=24, logprobs=True, **params)
        text = fused.choices[0].message.content
        assert text and text == by_dist.choices[0].message.content, (params, text, by_dist)
        assert (
            fused.usage.completion_tokens == by_dist.usage.completion_tokens == len(by_dist.choices[0].logprobs.content)
        )
        chunks = list(
            client.chat.completions.create(model="any", messages=prompt, max_tokens=24, stream=True, **params)
        )
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text, params
        assert chunks[-1].choices[0].finish_reason == fused.choices[0].finish_reason
    # A stop string (watched by the worker as it decodes) ends the text where it starts.
    whole = client.chat.completions.create(model="any", messages=prompt, max_tokens=24, temperature=0)
    word = whole.choices[0].message.content.split()[3]
    cut = client.chat.completions.create(model="any", messages=prompt, max_tokens=24, temperature=0, stop=[word])
    assert cut.choices[0].finish_reason == "stop" and whole.choices[0].message.content.startswith(
        cut.choices[0].message.content
    )
    assert word not in cut.choices[0].message.content


def test_vllm_sampling_extras_and_nul_characters_are_honoured(stack, api_tenant_a):
    """What vLLM's own benchmark client sends: ``ignore_eos`` (every choice runs to
    ``max_tokens``), ``min_tokens`` (EOS barred until then) and prompts with U+0000 (its random
    datasets make them; OpenAI and vLLM answer them)."""
    client = openai_client(stack, api_tenant_a.key_secret)
    short = [{"role": "user", "content": "Reply with the single word: yes"}]
    plain = client.chat.completions.create(model="any", messages=short, max_tokens=64, temperature=0)
    assert plain.choices[0].finish_reason == "stop", plain  # ended by EOS before the limit
    least = plain.usage.completion_tokens + 6
    longer = client.chat.completions.create(
        model="any", messages=short, max_tokens=least + 16, temperature=0, extra_body={"min_tokens": least}
    )
    assert longer.usage.completion_tokens >= least, longer
    assert longer.choices[0].message.content.startswith(plain.choices[0].message.content.rstrip()), longer
    for stream in (False, True):
        forced = client.completions.create(
            model="any", prompt="The end.", max_tokens=24, temperature=0, stream=stream, extra_body={"ignore_eos": True}
        )
        if stream:
            chunks = list(forced)
            assert chunks[-1].choices[0].finish_reason == "length"
        else:
            assert forced.choices[0].finish_reason == "length" and forced.usage.completion_tokens == 24, forced

    with_nul = client.chat.completions.create(
        model="any", messages=[{"role": "user", "content": "a\x00b, then say hi"}], max_tokens=4, temperature=0
    )
    without = client.chat.completions.create(
        model="any", messages=[{"role": "user", "content": "ab, then say hi"}], max_tokens=4, temperature=0
    )
    assert with_nul.usage.prompt_tokens > without.usage.prompt_tokens, (with_nul.usage, without.usage)
    prompt = client.completions.create(model="any", prompt="x\x00y", max_tokens=2, temperature=0)
    assert prompt.usage.prompt_tokens >= 3 and prompt.choices, prompt

    import openai

    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="any", messages=short, max_tokens=4, extra_body={"min_tokens": 5})
    assert "min_tokens must not exceed max_tokens" in str(refused.value)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model="any", messages=short, max_tokens=8, stop=["x"], extra_body={"ignore_eos": True}
        )
    assert "ignore_eos cannot be combined" in str(refused.value)
