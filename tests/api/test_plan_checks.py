"""``manage.py check --deploy`` compares the plans with the pools the live workers report in their
heartbeats: a plan of 256 device pages per run (what the free plan promised) on a worker whose
pool has 180 is an error naming the limit and the bound; a pool large enough, or no live worker,
is none; the plans the stack ships fit the pool ``make up`` starts."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from api.checks import PLAN_EXCEEDS_POOL
from api.models import Plan

pytestmark = pytest.mark.django_db


def _beat(worker_heartbeats, name: str, pages_total: int) -> None:
    worker_heartbeats({"name": name, "ok": True, "pages_free": pages_total, "pages_total": pages_total, "sessions": 0})


def test_a_plan_limit_larger_than_one_accounts_bound_on_a_live_worker_is_an_error(worker_heartbeats) -> None:
    Plan.objects.filter(name="free").update(max_device_pages_per_run=256)
    _beat(worker_heartbeats, "big", 4000)
    _beat(worker_heartbeats, "small", 180)  # the smallest pool bounds every plan
    call_command("check")  # not a deploy check: migrate (which runs the checks) is never stopped by it
    with pytest.raises(SystemCheckError) as raised:
        call_command("check", deploy=True)
    text = str(raised.value)
    assert PLAN_EXCEEDS_POOL in text
    assert "plan 'free': max_device_pages_per_run=256 exceeds what one account may take" in text
    assert "(135 of 180, 45 reserved for others)" in text


def test_plans_that_fit_or_no_live_worker_pass(worker_heartbeats) -> None:
    call_command("check", deploy=True)  # no heartbeat: nothing to compare
    _beat(worker_heartbeats, "big", 4000)
    call_command("check", deploy=True)


def test_the_shipped_plans_fit_the_pool_make_up_starts(worker_heartbeats) -> None:
    """181 pages: SmolLM2-135M in float32 in vLLM-CPU's default KV space (the issue's figure)."""
    assert Plan.objects.get(name="free").max_device_pages_per_run == 128
    _beat(worker_heartbeats, "local", 181)
    call_command("check", deploy=True)
