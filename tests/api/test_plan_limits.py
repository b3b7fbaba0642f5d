"""The plan's limits as every ``/v1`` answer reads them (``quotas.plan_limits``: SQL written once a
process, not a queryset): each field is the plan row's, a plan without a row gets the fallback,
and a plan without its own stream cap gets the service's."""

from __future__ import annotations

import dataclasses

import pytest

from api.models import Plan
from api.services import quotas

pytestmark = pytest.mark.django_db


def test_every_limit_is_the_plan_rows(api_tenant_a, settings):
    tenant = api_tenant_a.tenant
    Plan.objects.update_or_create(
        name="probe",
        defaults={
            "max_concurrent_runs": 3,
            "max_tokens_per_run": 777,
            "tokens_per_month": None,
            "scheduling_weight": 2.5,
            "kv_pinned_device_share": 0.25,
            "max_concurrent_streams": 5,
            "max_spawn_depth": 1,
        },
    )
    tenant.plan = "probe"
    limits = quotas.plan_limits(tenant)
    row = Plan.objects.get(name="probe")
    assert limits == quotas.PlanLimits(**{f.name: getattr(row, f.name) for f in dataclasses.fields(quotas.PlanLimits)})
    assert (limits.max_tokens_per_run, limits.tokens_per_month, limits.scheduling_weight) == (777, None, 2.5)


def test_a_plan_without_a_row_gets_the_fallback_and_the_services_stream_cap(api_tenant_a, settings):
    tenant = api_tenant_a.tenant
    tenant.plan = "no-such-plan"
    settings.SYMPHONY_STREAMS_PER_TENANT = 7
    assert quotas.plan_limits(tenant) == dataclasses.replace(quotas.FALLBACK, max_concurrent_streams=7)


def test_a_plan_without_its_own_stream_cap_gets_the_services(api_tenant_a, settings):
    tenant = api_tenant_a.tenant
    Plan.objects.update_or_create(name="no-cap", defaults={"max_concurrent_streams": None})
    tenant.plan = "no-cap"
    settings.SYMPHONY_STREAMS_PER_TENANT = 9
    assert quotas.plan_limits(tenant).max_concurrent_streams == 9
