"""OpenAI's token headers (``x-ratelimit-limit-tokens``, ``-remaining-tokens``, ``-reset-tokens``)
through the whole real stack (uvicorn, Celery, gVisor sandbox, the worker on the tiny model), read
as the ``openai`` client's users read them: from its raw response. They say the token budget the
service enforces, the plan's monthly allowance (``tokens_per_month``): what a completion used is
gone from ``remaining`` on the next answer, and once nothing remains the next request is refused
with the same headers saying 0."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tests.conftest import wait_for
from tests.integration.openai_support import openai_client
from tests.plugins.worker import RunningWorker

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.integration,
    pytest.mark.docker,
    pytest.mark.vllm,
    pytest.mark.timeout(600),
]

ALLOWANCE = 50_000
QUESTION = [{"role": "user", "content": "Say hi."}]


@pytest.fixture(scope="module")
def stack_worker(shared_stack_worker: RunningWorker) -> RunningWorker:
    return shared_stack_worker


def _seconds(duration: str) -> int:
    """OpenAI's (Go's) duration, ``"26h3m4s"``, in seconds."""
    total, number = 0, ""
    for char in duration:
        if char.isdigit():
            number += char
        else:
            total += int(number) * {"h": 3600, "m": 60, "s": 1}[char]
            number = ""
    return total


def _used(tenant) -> int:
    from api.services.quotas import tokens_this_month

    return tokens_this_month(tenant)


def test_token_headers_say_the_monthly_allowance_the_service_enforces(stack, api_tenant_a):
    import openai

    from api.models import Plan, Run, UsageRecord
    from api.services.quotas import next_period_start

    Plan.objects.update_or_create(name=api_tenant_a.tenant.plan, defaults={"tokens_per_month": ALLOWANCE})
    client = openai_client(stack, api_tenant_a.key_secret, timeout=180)

    first = client.chat.completions.with_raw_response.create(model="any", messages=QUESTION, max_tokens=4)
    completion = first.parse()
    assert first.headers["x-ratelimit-limit-tokens"] == str(ALLOWANCE)
    assert first.headers["x-ratelimit-remaining-tokens"] == str(ALLOWANCE)  # nothing used before it
    # The allowance starts afresh at the next month (UTC).
    now = datetime.now(UTC)
    month_end = datetime.combine(next_period_start(now.date()), datetime.min.time(), tzinfo=UTC)
    assert abs(_seconds(first.headers["x-ratelimit-reset-tokens"]) - (month_end - now).total_seconds()) < 120
    # The requests headers stay beside them.
    assert "x-ratelimit-limit-requests" in first.headers

    run = Run.objects.get(tenant=api_tenant_a.tenant)
    wait_for(lambda: UsageRecord.objects.filter(run_id=run.pk).exists(), timeout=60, message="the run's usage")
    used = _used(api_tenant_a.tenant)
    assert used > 0 and completion.usage.completion_tokens > 0

    # Streamed answers carry them too, with what the first completion used taken off.
    with client.chat.completions.with_streaming_response.create(
        model="any", messages=QUESTION, max_tokens=2, stream=True
    ) as streamed:
        assert streamed.headers["x-ratelimit-remaining-tokens"] == str(ALLOWANCE - used)
        assert streamed.headers["x-ratelimit-limit-tokens"] == str(ALLOWANCE)
        list(streamed.iter_lines())

    # The allowance is the one enforced: with nothing left the request is refused, and says 0.
    wait_for(lambda: Run.objects.filter(tenant=api_tenant_a.tenant, status__in=Run.TERMINAL).count() == 2, timeout=60)
    wait_for(lambda: UsageRecord.objects.filter(tenant=api_tenant_a.tenant).count() == 2, timeout=60)
    Plan.objects.update_or_create(
        name=api_tenant_a.tenant.plan, defaults={"tokens_per_month": _used(api_tenant_a.tenant)}
    )
    with pytest.raises(openai.RateLimitError) as refused:
        client.chat.completions.create(model="any", messages=QUESTION, max_tokens=2)
    assert refused.value.response.status_code == 429
    assert refused.value.code == "quota_exceeded" and "monthly token quota" in refused.value.message
    assert refused.value.response.headers["x-ratelimit-remaining-tokens"] == "0"


def test_a_plan_without_a_monthly_allowance_sends_no_token_headers(stack, api_tenant_a):
    from api.models import Plan

    Plan.objects.update_or_create(name=api_tenant_a.tenant.plan, defaults={"tokens_per_month": None})
    listed = openai_client(stack, api_tenant_a.key_secret).models.with_raw_response.list()
    assert listed.parse().data
    assert "x-ratelimit-limit-tokens" not in listed.headers
    assert "x-ratelimit-limit-requests" in listed.headers
