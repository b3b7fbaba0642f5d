"""The automatic prefix cache through the whole real stack (uvicorn, Celery, gVisor sandbox, the
worker on the tiny model), driven by the ``openai`` client as a black box: the second turn of a
conversation reports ``usage.prompt_tokens_details.cached_tokens`` covering the first turn's
prompt (its whole pages), the run's usage and the tenant's usage sums record them, and another
tenant sending the same conversation gets nothing from the first tenant's cache."""

from __future__ import annotations

import pytest

from tests.integration.openai_support import openai_client
from tests.plugins.worker import RunningWorker

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.integration,
    pytest.mark.docker,
    pytest.mark.vllm,
    pytest.mark.timeout(600),
]

SYSTEM = "You are the support assistant of a small bicycle shop. Answer in one short sentence. " + " ".join(
    f"Rule {i}: be polite, precise and brief about wheels, brakes, gears and frames." for i in range(20)
)


@pytest.fixture(scope="module")
def stack_worker(shared_stack_worker: RunningWorker) -> RunningWorker:
    return shared_stack_worker


def test_second_turn_reports_the_first_turns_prompt_as_cached(stack, stack_worker, api_tenant_a, api_tenant_b):
    block = stack_worker.admin.health()["block_size"]
    client = openai_client(stack, api_tenant_a.key_secret)
    turn1 = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Do you fix flat tyres?"}]
    first = client.chat.completions.create(model="any", messages=turn1, max_tokens=16, temperature=0)
    p1 = first.usage.prompt_tokens
    assert p1 > block, (p1, block)  # at least one whole page to reuse
    assert first.usage.prompt_tokens_details.cached_tokens == 0  # a fresh tenant has nothing cached

    answer = first.choices[0].message.content or ""
    turn2 = [*turn1, {"role": "assistant", "content": answer}, {"role": "user", "content": "How long does it take?"}]
    second = client.chat.completions.create(model="any", messages=turn2, max_tokens=16, temperature=0)
    cached = second.usage.prompt_tokens_details.cached_tokens
    # Every whole page of the first turn's prompt (the partial last one is recomputed).
    assert p1 - p1 % block <= cached < second.usage.prompt_tokens, (p1, block, cached, second.usage)

    # Streamed, with include_usage: the same conversation is cached too.
    chunks = list(
        client.chat.completions.create(
            model="any",
            messages=turn2,
            max_tokens=4,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens >= cached

    # The runs' usage rows carry the cached tokens (billed at the plan's cached-token price).
    days = api_tenant_a.key_client().get("/api/v1/usage").json()["days"]
    assert sum(day["cached_tokens"] for day in days) >= 2 * cached

    # Never shared across tenants: the same conversation from another tenant computes it all.
    other = openai_client(stack, api_tenant_b.key_secret)
    theirs = other.chat.completions.create(model="any", messages=turn2, max_tokens=4, temperature=0)
    assert theirs.usage.prompt_tokens_details.cached_tokens == 0
