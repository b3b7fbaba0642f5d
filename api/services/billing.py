"""Usage aggregation per day for a tenant (the basis of invoices)."""

from __future__ import annotations

import uuid
from datetime import date
from decimal import ROUND_HALF_UP, Decimal

from django.db.models import Count, Q, QuerySet, Sum
from django.db.models.functions import TruncDate

from api.models import Plan, Tenant, UsageRecord
from gpu_worker import run_files

SUMMED = UsageRecord.METERED
#: Runs among usage rows, including runs deleted since (their rows keep ``from_run``).
RUNS = Count("pk", filter=Q(from_run=True))


def _in_range(tenant: Tenant, start: date | None, end: date | None) -> QuerySet[UsageRecord]:
    qs = UsageRecord.objects.filter(tenant=tenant)
    if start:
        qs = qs.filter(created_at__date__gte=start)
    if end:
        qs = qs.filter(created_at__date__lte=end)
    return qs


def usage_by_day(tenant: Tenant, start: date | None = None, end: date | None = None) -> list[dict]:
    """One row per UTC day in [start, end] with the summed usage, the number of runs and
    ``cost`` (USD, the day's quantities at the tenant's unit prices, as its invoice counts it)."""
    rows = (
        _in_range(tenant, start, end)
        .annotate(day=TruncDate("created_at"))
        .values("day")
        .annotate(runs=RUNS, **{f: Sum(f) for f in SUMMED})
        .order_by("day")
    )
    prices = unit_prices(tenant)
    return [{**row, "day": row["day"].isoformat(), "cost": _cost(row, prices)} for row in rows]


#: ``group_by`` of :func:`usage_by_group` -> the run's fields that identify and name a group.
GROUPINGS = {
    "program": ("run__program_version__program_id", "run__program_version__program__name", None),
    "api_key": ("run__api_key_id", "run__api_key__name", "run__api_key__prefix"),
}


def usage_by_group(tenant: Tenant, group_by: str, start: date | None = None, end: date | None = None) -> list[dict]:
    """The usage in [start, end] summed per program or per API key, most decode tokens first.

    Each row: ``kind`` (``program`` / ``api_key``; ``console`` for runs started without a key,
    from the console; ``deleted`` for runs deleted since, with their program; ``storage`` for
    stored KV files, which no run consumed), ``id``, ``name``,
    ``prefix`` (keys only), ``runs``, the metered sums and their ``cost`` (USD). Raises KeyError
    for another grouping."""
    id_field, name_field, prefix_field = GROUPINGS[group_by]
    qs = _in_range(tenant, start, end)
    fields = [f for f in (id_field, name_field, prefix_field) if f]
    rows = []
    for row in (
        qs.filter(run__isnull=False)
        .values(*fields)
        .annotate(runs=Count("run"), **{f: Sum(f) for f in SUMMED})
        .order_by(id_field)
    ):
        ident = row.pop(id_field)
        entry = {"kind": group_by if ident is not None else "console", "id": ident, "name": row.pop(name_field)}
        if prefix_field:
            entry["prefix"] = row.pop(prefix_field)
        rows.append({**entry, **row})
    deleted = qs.filter(from_run=True, run__isnull=True).aggregate(runs=RUNS, **{f: Sum(f) for f in SUMMED})
    if deleted["runs"]:
        rows.append({"kind": "deleted", "id": None, "name": None, **deleted})
    storage = qs.filter(from_run=False).aggregate(**{f: Sum(f) for f in SUMMED})
    if any(storage.values()):
        rows.append({"kind": "storage", "id": None, "name": None, "runs": 0, **storage})
    prices = unit_prices(tenant)
    for row in rows:
        row["cost"] = _cost(row, prices)
    return sorted(rows, key=lambda r: (-(r["decode_tokens"] or 0), -(r["prefill_tokens"] or 0), str(r["name"])))


#: Prices in USD per unit. Tokens are priced per million, page-seconds per thousand; ``None``:
#: the tenant's plan sets the price (:func:`unit_prices`).
PRICE_SHEET = {
    "prefill_tokens": ("Prefill tokens", Decimal("0.10") / 1_000_000),
    "cached_tokens": ("Cached prompt tokens (prefix cache, stored KV files)", None),
    "decode_tokens": ("Decode tokens", Decimal("0.40") / 1_000_000),
    "pred_calls": ("Forward calls", Decimal("0.000001")),
    "page_seconds": ("KV page-seconds", Decimal("0.02") / 1000),
    "io_calls": ("Brokered I/O calls", Decimal("0.00001")),
    "sandbox_seconds": ("Sandbox seconds", Decimal("0.00002")),
    "kv_gib_hours": ("Stored KV GiB-hours", Decimal("0.0002")),
    "streamed_bytes": ("Bytes streamed to clients (send_to_user)", None),
}
#: Per GiB streamed when the tenant's plan has no row (the model field's default).
FALLBACK_STREAMED_GIB_PRICE = Decimal("0.10")
#: Of a prefill token's price, what a cached prompt token costs without a plan row.
FALLBACK_CACHED_TOKEN_PRICE_RATIO = Decimal("0.1")
#: The storage meter bills this many seconds of stored KV bytes per run (Celery beat period).
KV_METER_PERIOD_S = 300
#: Every amount (a run's cost, a day's, an invoice line and total) is to the micro-dollar: most
#: runs cost far less than a cent, and a run's figure must be findable on the invoice.
MICRO = Decimal("0.000001")


def _priced(sums: dict, prices: dict[str, Decimal]) -> dict[str, Decimal]:
    """Each metered quantity of ``sums`` at its unit price, to the micro-dollar (half up)."""
    return {
        field: (Decimal(str(sums.get(field) or 0)) * prices[field]).quantize(MICRO, rounding=ROUND_HALF_UP)
        for field in PRICE_SHEET
    }


def _cost(sums: dict, prices: dict[str, Decimal]) -> str:
    return str(sum(_priced(sums, prices).values(), Decimal("0")).quantize(MICRO))


def _month_range(month: str) -> tuple[date, date]:
    year, mon = (int(part) for part in month.split("-"))
    start = date(year, mon, 1)
    end = date(year + (mon == 12), mon % 12 + 1, 1)
    return start, end


def unit_prices(tenant: Tenant) -> dict[str, Decimal]:
    """USD per unit of each metered quantity for ``tenant``: PRICE_SHEET's, its plan's
    ``streamed_gib_price`` per byte streamed and its ``cached_token_price_ratio`` of a prefill
    token per cached prompt token."""
    plan = Plan.objects.filter(name=tenant.plan).first()
    per_gib = plan.streamed_gib_price if plan is not None else FALLBACK_STREAMED_GIB_PRICE
    ratio = plan.cached_token_price_ratio if plan is not None else FALLBACK_CACHED_TOKEN_PRICE_RATIO
    prefill = PRICE_SHEET["prefill_tokens"][1]
    assert prefill is not None
    plan_set = {"streamed_bytes": Decimal(per_gib) / (1 << 30), "cached_tokens": prefill * Decimal(ratio)}
    return {field: price if price is not None else plan_set[field] for field, (_, price) in PRICE_SHEET.items()}


def invoice(tenant: Tenant, month: str) -> dict:
    """Invoice for ``YYYY-MM``: one line per metered quantity from PRICE_SHEET and one per UTC
    day with usage (``days``: its runs and amount), in USD to the micro-dollar like a run's
    cost. Each day's quantities are priced and rounded per line; a line's amount is its days'
    sum and the total the lines' (so the days sum to the total too). Raises ValueError for a
    malformed month."""
    start, end = _month_range(month)
    in_month = UsageRecord.objects.filter(tenant=tenant, created_at__date__gte=start, created_at__date__lt=end)
    per_day = list(
        in_month.annotate(day=TruncDate("created_at"))
        .values("day")
        .annotate(runs=RUNS, **{f: Sum(f) for f in SUMMED})
        .order_by("day")
    )
    prices = unit_prices(tenant)
    priced_days = [(row, _priced(row, prices)) for row in per_day]
    lines = []
    for field, (label, _) in PRICE_SHEET.items():
        quantity = sum((Decimal(str(row[field] or 0)) for row in per_day), Decimal("0"))
        amount = sum((priced[field] for _, priced in priced_days), Decimal("0")).quantize(MICRO)
        lines.append(
            {
                "item": field,
                "description": label,
                "quantity": str(quantity),
                "unit_price": str(prices[field]),
                "amount": str(amount),
            }
        )
    days = [
        {
            "day": row["day"].isoformat(),
            "runs": row["runs"],
            "amount": str(sum(priced.values(), Decimal("0")).quantize(MICRO)),
        }
        for row, priced in priced_days
    ]
    total = sum((Decimal(line["amount"]) for line in lines), Decimal("0")).quantize(MICRO)
    return {
        "id": month,
        "period_start": start.isoformat(),
        "period_end": end.isoformat(),
        "runs": sum(row["runs"] for row in per_day),
        "currency": "USD",
        "lines": lines,
        "days": days,
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
    # A closed tenant's files are being deleted (api/services/tenant_closure.py): not billed.
    files = KVFile.objects.filter(tenant__closed_at__isnull=True).exclude(
        pk__in=_run_files_past_their_tree(KVFile.objects.filter(name__startswith=run_files.STORED_PREFIX))
    )
    stored = files.values("tenant_id").annotate(total=DbSum("bytes")).filter(total__gt=0)
    for row in stored:
        UsageRecord.objects.create(tenant_id=row["tenant_id"], kv_gib_hours=row["total"] / (1 << 30) * hours)
    return len(stored)


def _run_files_past_their_tree(rows) -> list[int]:
    """Mirror rows of run-scoped KV files (gpu_worker/run_files.py) whose tree's root run is no
    longer queued or running: the worker removes them when the tree ends, and until its mirror
    says so they are never billed as stored (a lost worker's could stay listed for a while)."""
    from api.models import Run

    by_tree: dict[str, list[int]] = {}
    for pk, name in rows.values_list("pk", "name"):
        tree = run_files.tree_of(name)
        if tree is not None:
            by_tree.setdefault(tree, []).append(pk)
    valid = [tree for tree in by_tree if _is_uuid(tree)]
    live_runs = Run.objects.filter(pk__in=valid, status__in=("queued", "running"))
    live = {str(pk) for pk in live_runs.values_list("pk", flat=True)}
    return [pk for tree, pks in by_tree.items() if tree not in live for pk in pks]


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


def usage_cost(tenant: Tenant, record: UsageRecord) -> dict:
    """What one usage row costs at the tenant's prices: ``{currency, total, lines: {field:
    amount}}``, amounts as decimal strings to the micro-dollar like the invoice's (which prices
    each day's summed quantities, so a day's amount can differ from its runs' sum by rounding)."""
    lines = _priced({name: getattr(record, name) for name in PRICE_SHEET}, unit_prices(tenant))
    total = sum(lines.values(), Decimal("0"))
    return {"currency": "USD", "total": str(total), "lines": {k: str(v) for k, v in lines.items() if v}}
