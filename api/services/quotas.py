"""Plan limits per tenant: the checks applied before a run is accepted, and the session limits
the worker enforces while it runs (tokens, device pages, deadline, tool hosts)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from django.db.models import Sum
from django.utils import timezone

from api.models import KVFile, Plan, Run, Tenant, UsageRecord


@dataclass(frozen=True)
class PlanLimits:
    """A plan's limits as plain data (``None`` = unlimited)."""

    max_concurrent_runs: int
    max_tokens_per_run: int
    max_run_seconds: int
    tokens_per_month: int | None
    max_device_pages_per_run: int | None
    kv_bytes_stored: int | None
    #: The worker's fair-share weight for the tenant's runs (1 = an equal share).
    scheduling_weight: float = 1.0
    #: Control-plane requests per minute of the whole tenant (api/throttling.py).
    api_requests_per_minute: int | None = 600


#: Used when a tenant names a plan that has no row (e.g. deleted by an operator): the most
#: restrictive sensible defaults rather than unlimited.
FALLBACK = PlanLimits(2, 4096, 120, 1_000_000, 256, 1 << 30)
#: A run that states no deadline gets this many seconds (capped by the plan).
DEFAULT_RUN_SECONDS = 60


class QuotaExceeded(Exception):
    """The run would exceed the tenant's plan; the message says which limit."""


def plan_limits(tenant: Tenant) -> PlanLimits:
    plan = Plan.objects.filter(name=tenant.plan).first()
    if plan is None:
        return FALLBACK
    return PlanLimits(
        plan.max_concurrent_runs,
        plan.max_tokens_per_run,
        plan.max_run_seconds,
        plan.tokens_per_month,
        plan.max_device_pages_per_run,
        plan.kv_bytes_stored,
        plan.scheduling_weight,
        plan.api_requests_per_minute,
    )


def tokens_this_month(tenant: Tenant) -> int:
    start = timezone.now().replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    sums = UsageRecord.objects.filter(tenant=tenant, created_at__gte=start).aggregate(
        p=Sum("prefill_tokens"), d=Sum("decode_tokens")
    )
    return int(sums["p"] or 0) + int(sums["d"] or 0)


def current_use(tenant: Tenant) -> dict:
    return {
        "active_runs": Run.objects.filter(tenant=tenant, status__in=["queued", "running"]).count(),
        "tokens_this_month": tokens_this_month(tenant),
        "kv_bytes_stored": int(KVFile.objects.filter(tenant=tenant).aggregate(b=Sum("bytes"))["b"] or 0),
    }


def quota_view(tenant: Tenant) -> dict:
    return {
        "plan": tenant.plan,
        "limits": asdict(plan_limits(tenant)),
        "use": current_use(tenant),
        "allowed_tool_hosts": list(tenant.allowed_tool_hosts),
    }


def check_can_start(tenant: Tenant, limits: dict) -> None:
    """Refuse a run the plan does not allow; the message names the limit."""
    plan = plan_limits(tenant)
    use = current_use(tenant)
    if use["active_runs"] >= plan.max_concurrent_runs:
        raise QuotaExceeded(f"plan {tenant.plan} allows {plan.max_concurrent_runs} concurrent runs")
    if int(limits.get("max_tokens", 0)) > plan.max_tokens_per_run:
        raise QuotaExceeded(f"max_tokens above plan limit {plan.max_tokens_per_run}")
    if float(limits.get("deadline_s", 0)) > plan.max_run_seconds:
        raise QuotaExceeded(f"deadline_s above plan limit {plan.max_run_seconds}")
    if plan.tokens_per_month is not None and use["tokens_this_month"] >= plan.tokens_per_month:
        raise QuotaExceeded(f"monthly token quota of {plan.tokens_per_month} is used up")


def session_limits(run: Run) -> dict:
    """The limits the worker enforces for ``run``: the run's own (validated when it was created:
    api/serializers.py ``RunLimitsSerializer``), capped by the plan, with the monthly token
    allowance left as a further cap on tokens and the tenant's allowlist as the widest one."""
    tenant = run.tenant
    plan = plan_limits(tenant)
    requested = run.limits
    max_tokens = min(int(requested.get("max_tokens") or plan.max_tokens_per_run), plan.max_tokens_per_run)
    if plan.tokens_per_month is not None:
        max_tokens = max(0, min(max_tokens, plan.tokens_per_month - tokens_this_month(tenant)))
    deadline = min(float(requested.get("deadline_s") or DEFAULT_RUN_SECONDS), float(plan.max_run_seconds))
    # A run may narrow the tenant's tool allowlist, never widen it.
    hosts = [
        h for h in tenant.allowed_tool_hosts if "allowed_hosts" not in requested or h in requested["allowed_hosts"]
    ]
    out: dict = {
        "max_tokens": max_tokens,
        "deadline_s": deadline,
        "allowed_hosts": hosts,
        "weight": plan.scheduling_weight,
    }
    pages = [p for p in (plan.max_device_pages_per_run, requested.get("max_pages")) if p is not None]
    if pages:
        out["max_pages"] = min(int(p) for p in pages)
    if requested.get("max_kv_bytes") is not None:
        out["max_kv_bytes"] = int(requested["max_kv_bytes"])
    if plan.kv_bytes_stored is not None:
        out["max_stored_bytes"] = plan.kv_bytes_stored
    return out
