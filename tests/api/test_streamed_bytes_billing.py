"""Bytes a run streamed to its client (``send_to_user``, metered by the worker) are billed: the
worker gets the plan's per-run stream budget, the usage record keeps the bytes, the usage API
sums them and the invoice prices them at the plan's ``streamed_gib_price``."""

from __future__ import annotations

from decimal import Decimal

import pytest

from api.models import Plan, Program
from api.services import programs
from api.services.quotas import session_limits
from api.services.runs import RunOutcome, create_run, finish_run

pytestmark = pytest.mark.django_db

GIB = 1 << 30


def test_streamed_bytes_are_limited_by_the_plan_metered_and_priced_by_it(api_tenant_a, api_tenant_b):
    tenant = api_tenant_a.tenant
    Plan.objects.filter(name=tenant.plan).update(stream_bytes_per_run=2 * 1024 * 1024, streamed_gib_price="0.50")
    prog = Program.objects.create(tenant=tenant, name="p")
    programs.add_version(prog, "p.py", b"def main(a):\n    return 1\n")
    run, _ = create_run(tenant, prog, None, {}, {})
    assert session_limits(run)["max_stream_bytes"] == 2 * 1024 * 1024

    finish_run(str(run.pk), RunOutcome(status="succeeded", usage={"streamed_bytes": 3 * GIB}))
    client = api_tenant_a.key_client()
    days = client.get("/api/v1/usage").json()["days"]
    assert sum(day["streamed_bytes"] for day in days) == 3 * GIB
    month = client.get("/api/v1/invoices").json()[0]["id"]
    detail = client.get(f"/api/v1/invoices/{month}").json()
    line = next(line for line in detail["lines"] if line["item"] == "streamed_bytes")
    assert line["quantity"] == str(3 * GIB) and line["amount"] == "1.500000"
    assert Decimal(line["unit_price"]) * GIB == Decimal("0.50")
    assert detail["total"] == "1.500000"
    other = api_tenant_b.key_client().get(f"/api/v1/invoices/{month}").json()
    assert other["total"] == "0.000000"
