"""Warn a tenant's owners by mail before its monthly token quota stops its runs.

When a run's usage is recorded (``runs.finish_run``), the tenant's tokens this month are compared
with its plan's ``tokens_per_month``; each threshold of ``SYMPHONY_QUOTA_ALERT_PERCENTS`` (80 and
100 by default) crossed for the first time this month gets a ``QuotaNotice`` row (unique, so runs
ending together notify once) and the owners one mail, for the highest threshold crossed: a run
that jumps from 50% to 100% sends the 100% mail only. The notice is also in the tenant's audit log.
Plans without a monthly token quota never alert.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from api.models import AuditLog, QuotaNotice, Tenant
from api.services import mail
from api.services.quotas import PlanLimits, plan_limits, tokens_this_month

log = logging.getLogger(__name__)

TOKENS = "tokens_per_month"


def thresholds() -> list[int]:
    return sorted({int(p) for p in settings.SYMPHONY_QUOTA_ALERT_PERCENTS})


def check_tokens(tenant: Tenant, plan: PlanLimits | None = None) -> QuotaNotice | None:
    """Record and mail the notice for the highest token threshold newly crossed; None when
    nothing new was crossed (or the plan has no monthly quota). ``plan``: the tenant's plan when
    the caller has read it already."""
    limit = (plan or plan_limits(tenant)).tokens_per_month
    if not limit or tenant.closed_at is not None:
        return None
    used = tokens_this_month(tenant)
    period = timezone.now().strftime("%Y-%m")
    created: list[QuotaNotice] = []
    for percent in thresholds():
        if used * 100 < percent * limit:
            break
        try:
            with transaction.atomic():
                created.append(
                    QuotaNotice.objects.create(
                        tenant=tenant, quota=TOKENS, period=period, percent=percent, used=used, limit=limit
                    )
                )
        except IntegrityError:
            continue  # crossed earlier this month: notified then
    if not created:
        return None
    notice = created[-1]
    AuditLog.objects.create(
        tenant=tenant,
        action="quota.notice",
        target=TOKENS,
        detail={"percent": notice.percent, "used": used, "limit": limit, "period": period},
    )
    mail.queue_quota_notice(notice)
    log.info("quota_notice tenant=%s percent=%s used=%s limit=%s", tenant.slug, notice.percent, used, limit)
    return notice


def after_usage(tenant: Tenant, plan: PlanLimits | None = None) -> None:
    """Called once a run's usage is recorded; never fails the caller (billing is done)."""
    try:
        check_tokens(tenant, plan)
    except Exception:
        log.exception("quota_notice_failed tenant=%s", tenant.slug)
