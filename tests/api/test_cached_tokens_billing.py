"""Prompt tokens served from the prefix cache (metered by the worker as ``cached_tokens``) are
billed at the plan's ``cached_token_price_ratio`` of a prefill token: the usage record keeps
them, the usage API sums them, the run's cost and the invoice price them, and the OpenAI usage
body reports them as ``prompt_tokens_details.cached_tokens``."""

from __future__ import annotations

from decimal import Decimal

import pytest

from api.models import Plan, Program, Run
from api.services import programs
from api.services.billing import PRICE_SHEET
from api.services.openai_requests import usage_body
from api.services.runs import RunOutcome, create_run, finish_run

pytestmark = pytest.mark.django_db

PREFILL = PRICE_SHEET["prefill_tokens"][1]


def _run(tenant):
    prog = Program.objects.create(tenant=tenant, name="p")
    programs.add_version(prog, "p.py", b"def main(a):\n    return 1\n")
    run, _ = create_run(tenant, prog, None, {}, {})
    return run


def test_cached_tokens_are_metered_and_priced_at_the_plans_ratio(api_tenant_a, api_tenant_b):
    tenant = api_tenant_a.tenant
    assert Plan.objects.get(name=tenant.plan).cached_token_price_ratio == Decimal("0.1")  # the default
    Plan.objects.filter(name=tenant.plan).update(cached_token_price_ratio="0.25")
    run = _run(tenant)
    usage = {"prefill_tokens": 1_000_000, "cached_tokens": 4_000_000}
    finish_run(str(run.pk), RunOutcome(status="succeeded", usage=usage))
    client = api_tenant_a.key_client()
    assert sum(day["cached_tokens"] for day in client.get("/api/v1/usage").json()["days"]) == 4_000_000
    cost = client.get(f"/api/v1/runs/{run.pk}").json()["usage"]["cost"]
    assert cost["lines"]["cached_tokens"] == "0.100000" and cost["lines"]["prefill_tokens"] == "0.100000"
    month = client.get("/api/v1/invoices").json()[0]["id"]
    detail = client.get(f"/api/v1/invoices/{month}").json()
    line = next(line for line in detail["lines"] if line["item"] == "cached_tokens")
    assert line["quantity"] == "4000000" and line["amount"] == "0.100000"
    assert Decimal(line["unit_price"]) == PREFILL * Decimal("0.25")
    assert detail["total"] == "0.200000"
    other = api_tenant_b.key_client().get(f"/api/v1/invoices/{month}").json()
    assert other["total"] == "0.000000"


def test_openai_usage_reports_cached_prompt_tokens(api_tenant_a):
    run = _run(api_tenant_a.tenant)
    result = {"choices": [], "usage": {"prompt_tokens": 40, "completion_tokens": 3}}
    Run.objects.filter(pk=run.pk).update(result=result)
    pending = Run.objects.select_related("usage").get(pk=run.pk)
    assert usage_body(pending)["prompt_tokens_details"] == {"cached_tokens": 0}  # no usage row yet
    finish_run(str(run.pk), RunOutcome(status="succeeded", result=result, usage={"cached_tokens": 32}))
    done = Run.objects.select_related("usage").get(pk=run.pk)
    assert usage_body(done) == {
        "prompt_tokens": 40,
        "completion_tokens": 3,
        "total_tokens": 43,
        "prompt_tokens_details": {"cached_tokens": 32},
    }
