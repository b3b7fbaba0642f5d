"""The month's tokens that admission reads are kept by the database (``MonthlyTokens``, migration
0028's trigger on the usage rows), so reading them costs one indexed row however many runs the
tenant made, and they stay exact whichever way a usage row is written, changed or deleted."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from api.models import MonthlyTokens, Program, Run, Tenant, UsageRecord
from api.services import programs, quotas
from api.services.runs import RunOutcome, create_run, finish_run, start_run

pytestmark = pytest.mark.django_db


def _summed(tenant: Tenant) -> int:
    """The month's tokens the slow way, from every usage row: what the counter must equal."""
    start = timezone.now().replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    rows = UsageRecord.objects.filter(tenant=tenant, created_at__gte=start)
    return sum(r.prefill_tokens + r.decode_tokens for r in rows)


def _finished_run(tenant: Tenant, prefill: int, decode: int) -> Run:
    program = Program.objects.get_or_create(tenant=tenant, name="p")[0]
    if not program.versions.exists():
        programs.add_version(program, "p.py", b"def main(a):\n    return 1\n")
    run, _ = create_run(tenant, program, None, {}, {})
    start_run(str(run.pk), "local")
    return finish_run(str(run.pk), RunOutcome("succeeded", usage={"prefill_tokens": prefill, "decode_tokens": decode}))


def test_every_write_of_a_usage_row_keeps_the_month_exact(api_tenant_a, api_tenant_b):
    tenant, other = api_tenant_a.tenant, api_tenant_b.tenant
    assert quotas.tokens_this_month(tenant) == 0

    run = _finished_run(tenant, 30, 12)
    _finished_run(other, 1000, 1000)
    assert quotas.tokens_this_month(tenant) == 42 == _summed(tenant)

    # A second finish of the same run (a redelivered task) overwrites its row: counted once.
    finish_run(str(run.pk), RunOutcome("succeeded", usage={"prefill_tokens": 50, "decode_tokens": 10}))
    assert quotas.tokens_this_month(tenant) == 60 == _summed(tenant)

    # The storage meter's rows carry no tokens; rows written directly (admin, scripts) count.
    UsageRecord.objects.create(tenant=tenant, kv_gib_hours=1.5)
    UsageRecord.objects.create(tenant=tenant, prefill_tokens=5, decode_tokens=0)
    assert quotas.tokens_this_month(tenant) == 65 == _summed(tenant)

    # Deleting the run keeps its usage (the row's run goes NULL): the month is unchanged.
    Run.objects.filter(pk=run.pk).delete()
    assert quotas.tokens_this_month(tenant) == 65 == _summed(tenant)

    # A row moved into last month leaves this month's count and lands in last month's.
    last_month = timezone.now().replace(day=1) - timedelta(days=1)
    UsageRecord.objects.filter(tenant=tenant, prefill_tokens=5).update(created_at=last_month)
    assert quotas.tokens_this_month(tenant) == 60 == _summed(tenant)
    assert MonthlyTokens.objects.get(tenant=tenant, month=last_month.date().replace(day=1)).tokens == 5

    UsageRecord.objects.filter(tenant=tenant, prefill_tokens=50).delete()
    assert quotas.tokens_this_month(tenant) == 0 == _summed(tenant)
    assert quotas.tokens_this_month(other) == 2000 == _summed(other)


def test_reading_the_month_is_one_statement_however_many_runs(api_tenant_a):
    tenant = api_tenant_a.tenant
    UsageRecord.objects.bulk_create(
        [UsageRecord(tenant=tenant, from_run=True, prefill_tokens=3, decode_tokens=1) for _ in range(500)]
    )
    with CaptureQueriesContext(connection) as queries:
        assert quotas.tokens_this_month(tenant) == 2000
    assert len(queries) == 1
    assert "api_usagerecord" not in queries[0]["sql"], queries[0]["sql"]


def test_a_tenant_with_usage_can_be_deleted(api_tenant_a):
    tenant = api_tenant_a.tenant  # no programs: a tenant with runs is closed and purged, not deleted
    UsageRecord.objects.create(tenant=tenant, prefill_tokens=7, decode_tokens=7)
    assert MonthlyTokens.objects.filter(tenant=tenant).exists()
    tenant.delete()  # its counters and its usage rows go in one cascade, in either order
    assert not MonthlyTokens.objects.filter(tenant_id=tenant.pk).exists()
    assert not UsageRecord.objects.filter(tenant_id=tenant.pk).exists()
