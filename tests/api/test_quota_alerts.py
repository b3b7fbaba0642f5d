"""Owners are mailed when their tenant's monthly tokens cross 80% and 100% of the plan's quota
(api/services/quota_alerts.py), once a month per threshold, from the moment a run's usage is
recorded (runs.finish_run). The whole path through a real worker, Celery and SMTP is
tests/integration/test_quota_notice_e2e.py."""

from __future__ import annotations

from datetime import date

import pytest
from django.contrib.auth import get_user_model
from django.core import mail as outbox

from api.models import AuditLog, Membership, Plan, Program, QuotaNotice
from api.services import mail, programs, quota_alerts, quotas
from api.services.runs import RunOutcome, create_run, finish_run, start_run
from tests.conftest import at_once

pytestmark = pytest.mark.django_db


@pytest.fixture
def queued(monkeypatch) -> list:
    calls: list = []
    monkeypatch.setattr(mail, "_enqueue", lambda task, *args: calls.append((task.name, args)))
    return calls


@pytest.fixture
def tenant(api_tenant_a):
    Plan.objects.create(name="metered", tokens_per_month=1000, max_concurrent_runs=50)
    api_tenant_a.tenant.plan = "metered"
    api_tenant_a.tenant.save()
    return api_tenant_a.tenant


def _run_using(tenant, tokens: int) -> None:
    program = Program.objects.get_or_create(tenant=tenant, name="p")[0]
    if not program.versions.exists():
        programs.add_version(program, "p.py", b"def main(a):\n    return 1\n")
    run, _ = create_run(tenant, program, None, {}, {})
    start_run(str(run.pk), "local")
    finish_run(
        str(run.pk), RunOutcome("succeeded", usage={"prefill_tokens": tokens // 2, "decode_tokens": tokens // 2})
    )


def _percents(tenant) -> list[int]:
    return sorted(QuotaNotice.objects.filter(tenant=tenant).values_list("percent", flat=True))


def test_owners_are_told_once_at_80_and_once_at_100_percent(tenant, queued):
    _run_using(tenant, 700)
    assert _percents(tenant) == [] and queued == []
    _run_using(tenant, 100)  # 800 of 1000
    assert _percents(tenant) == [80]
    _run_using(tenant, 100)  # 900: nothing new
    assert _percents(tenant) == [80]
    _run_using(tenant, 200)  # 1100
    assert _percents(tenant) == [80, 100]
    notices = {n.percent: n.pk for n in QuotaNotice.objects.filter(tenant=tenant)}
    assert queued == [
        ("api.send_quota_notice_mail", (notices[80],)),
        ("api.send_quota_notice_mail", (notices[100],)),
    ]
    audit = AuditLog.objects.filter(tenant=tenant, action="quota.notice").order_by("id")
    assert [a.detail["percent"] for a in audit] == [80, 100]
    assert audit.last().detail == {"percent": 100, "used": 1100, "limit": 1000, "period": audit.last().detail["period"]}


def test_a_jump_past_both_thresholds_sends_the_highest_only(tenant, queued):
    _run_using(tenant, 1200)
    assert _percents(tenant) == [80, 100]  # both recorded, so 80% is not mailed later
    assert queued == [("api.send_quota_notice_mail", (QuotaNotice.objects.get(tenant=tenant, percent=100).pk,))]


def test_no_quota_no_notice(api_tenant_a, queued):
    Plan.objects.create(name="unmetered", tokens_per_month=None)
    api_tenant_a.tenant.plan = "unmetered"
    api_tenant_a.tenant.save()
    _run_using(api_tenant_a.tenant, 10**9)
    assert _percents(api_tenant_a.tenant) == [] and queued == []


def test_thresholds_come_from_settings(tenant, queued, settings):
    settings.SYMPHONY_QUOTA_ALERT_PERCENTS = ["50", "90"]
    _run_using(tenant, 600)
    assert _percents(tenant) == [50]


def test_a_failing_notice_never_fails_the_runs_billing(tenant, monkeypatch):
    def boom(notice):
        raise RuntimeError("mail layer broken")

    monkeypatch.setattr(mail, "queue_quota_notice", boom)
    _run_using(tenant, 900)  # finish_run still returns; the usage is recorded
    assert tenant.usage.count() == 1


@pytest.mark.django_db(transaction=True)
def test_runs_ending_together_notify_once(tenant, queued):
    from api.models import UsageRecord

    UsageRecord.objects.create(tenant=tenant, prefill_tokens=900)
    at_once([lambda: quota_alerts.check_tokens(tenant)] * 4)
    assert _percents(tenant) == [80] and len(queued) == 1


def test_the_mail_goes_to_every_owner_and_says_when_the_quota_restarts(tenant, settings):
    settings.SYMPHONY_PUBLIC_URL = "https://console.example.com"
    second_owner = get_user_model().objects.create_user("grace@example.com", "grace@example.com", "pw-grace-1234")
    Membership.objects.create(tenant=tenant, user=second_owner, role="owner")
    member = get_user_model().objects.create_user("bob@example.com", "bob@example.com", "pw-bob-123456")
    Membership.objects.create(tenant=tenant, user=member, role="member")
    notice = QuotaNotice.objects.create(tenant=tenant, period="2026-12", percent=100, used=1234567, limit=1000000)
    QuotaNotice.objects.filter(pk=notice.pk).update(created_at="2026-12-14T10:00:00Z")

    assert mail.send_quota_notice(notice.pk) == 2
    assert sorted(m.to[0] for m in outbox.outbox) == ["alpha@example.com", "grace@example.com"]
    message = outbox.outbox[0]
    assert message.subject == "Alpha has used 100% of its monthly tokens on Symphony"
    assert "1,234,567 of the 1,000,000 tokens" in message.body
    assert "New runs are refused until the quota starts afresh on 2027-01-01" in message.body
    assert "https://console.example.com/usage" in message.body


def test_next_period_start_rolls_over_the_year():
    assert quotas.next_period_start(date(2026, 12, 31)) == date(2027, 1, 1)
    assert quotas.next_period_start(date(2026, 1, 15)) == date(2026, 2, 1)
