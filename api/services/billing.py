"""Usage aggregation per day for a tenant (the basis of invoices)."""

from __future__ import annotations

from datetime import date
from decimal import ROUND_HALF_UP, Decimal

from django.db.models import Count, Sum
from django.db.models.functions import TruncDate

from api.models import Tenant, UsageRecord

SUMMED = UsageRecord.METERED


def usage_by_day(tenant: Tenant, start: date | None = None, end: date | None = None) -> list[dict]:
    """One row per UTC day in [start, end] with the summed usage and the number of runs."""
    qs = UsageRecord.objects.filter(tenant=tenant)
    if start:
        qs = qs.filter(created_at__date__gte=start)
    if end:
        qs = qs.filter(created_at__date__lte=end)
    rows = (
        qs.annotate(day=TruncDate("created_at"))
        .values("day")
        .annotate(runs=Count("run"), **{f: Sum(f) for f in SUMMED})
        .order_by("day")
    )
    return [{**row, "day": row["day"].isoformat()} for row in rows]


#: Prices in USD per unit. Tokens are priced per million, page-seconds per thousand.
PRICE_SHEET = {
    "prefill_tokens": ("Prefill tokens", Decimal("0.10") / 1_000_000),
    "decode_tokens": ("Decode tokens", Decimal("0.40") / 1_000_000),
    "pred_calls": ("Forward calls", Decimal("0.000001")),
    "page_seconds": ("KV page-seconds", Decimal("0.02") / 1000),
    "io_calls": ("Brokered I/O calls", Decimal("0.00001")),
    "sandbox_seconds": ("Sandbox seconds", Decimal("0.00002")),
    "kv_gib_hours": ("Stored KV GiB-hours", Decimal("0.0002")),
}
#: The storage meter bills this many seconds of stored KV bytes per run (Celery beat period).
KV_METER_PERIOD_S = 300
CENT = Decimal("0.01")


def _month_range(month: str) -> tuple[date, date]:
    year, mon = (int(part) for part in month.split("-"))
    start = date(year, mon, 1)
    end = date(year + (mon == 12), mon % 12 + 1, 1)
    return start, end


def invoice(tenant: Tenant, month: str) -> dict:
    """Invoice for ``YYYY-MM``: one line per metered quantity from PRICE_SHEET, totals in USD
    rounded half-up to cents per line. Raises ValueError for a malformed month."""
    start, end = _month_range(month)
    sums = UsageRecord.objects.filter(tenant=tenant, created_at__date__gte=start, created_at__date__lt=end).aggregate(
        runs=Count("run"), **{f: Sum(f) for f in SUMMED}
    )
    lines = []
    for field, (label, unit_price) in PRICE_SHEET.items():
        quantity = Decimal(str(sums[field] or 0))
        amount = (quantity * unit_price).quantize(CENT, rounding=ROUND_HALF_UP)
        lines.append(
            {
                "item": field,
                "description": label,
                "quantity": str(quantity),
                "unit_price": str(unit_price),
                "amount": str(amount),
            }
        )
    total = sum((Decimal(line["amount"]) for line in lines), Decimal("0.00"))
    return {
        "id": month,
        "period_start": start.isoformat(),
        "period_end": end.isoformat(),
        "runs": sums["runs"],
        "currency": "USD",
        "lines": lines,
        "total": str(total),
    }


def invoice_months(tenant: Tenant) -> list[str]:
    """Months (``YYYY-MM``, newest first) in which the tenant has usage."""
    days = UsageRecord.objects.filter(tenant=tenant).dates("created_at", "month", order="DESC")
    return [d.strftime("%Y-%m") for d in days]


def meter_kv_storage(now: float | None = None) -> int:
    """Bill one period of every tenant's stored KV files (bytes in the KV file mirror) as a
    usage row without a run; returns how many tenants were billed.

    Each period slot is claimed once in Redis, so several beats (or a retried task) never bill
    twice; a slot nobody ran is not billed later (never over-bill on a guess).
    """
    import time

    import redis
    from django.conf import settings
    from django.db.models import Sum as DbSum

    from api.models import KVFile

    now = time.time() if now is None else now
    slot = int(now // KV_METER_PERIOD_S)
    claimed = redis.Redis.from_url(settings.REDIS_URL).set(
        f"symphony:kv-meter:{slot}", "1", nx=True, ex=KV_METER_PERIOD_S * 4
    )
    if not claimed:
        return 0
    hours = KV_METER_PERIOD_S / 3600
    stored = KVFile.objects.values("tenant_id").annotate(total=DbSum("bytes")).filter(total__gt=0)
    for row in stored:
        UsageRecord.objects.create(tenant_id=row["tenant_id"], kv_gib_hours=row["total"] / (1 << 30) * hours)
    return len(stored)
