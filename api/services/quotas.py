"""Plan limits per tenant: the checks applied before a run is accepted, and the session limits
the worker enforces while it runs (tokens, device pages, deadline, tool hosts, the tenant's
shares of the KV tiers)."""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, replace
from datetime import date, datetime

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import BigIntegerField, Model, OuterRef, Subquery, Sum
from django.db.models.functions import Coalesce
from django.utils import timezone

from api.models import KVFile, MonthlyTokens, Plan, Run, Tenant
from api.services import host_entries
from gpu_worker.protocol import KvQuotaLimits, RunLimits


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
    #: Fractions of a worker's device pool (pinned KV files) and host tier (spilled ones) the
    #: tenant may hold, and how many named KV files it may have (gpu_worker/kvfs/quota.py).
    kv_pinned_device_share: float | None = 0.1
    kv_host_share: float | None = 0.1
    max_kv_files: int | None = 100
    #: Event streams (run events, waiting ``/v1`` requests) the tenant may hold open at once
    #: (api/services/stream_leases.py): the plan's, else ``SYMPHONY_STREAMS_PER_TENANT``.
    max_concurrent_streams: int = 0
    #: Bytes one run may send with ``send_to_user`` (``None``: the worker's default, 64 MiB).
    stream_bytes_per_run: int | None = 16 * 1024 * 1024
    #: Sandbox memory (MiB) one run may ask for (``limits.memory_mb``).
    max_memory_mb: int = 1024
    #: Entries the tenant's owners may put on its tool-host allowlist.
    max_tool_hosts: int = 8
    #: Runs one run may spawn, and levels a run tree may have below its root (api/services/procs.py).
    max_children_per_run: int = 8
    max_spawn_depth: int = 2


#: Used when a tenant names a plan that has no row (e.g. deleted by an operator): the most
#: restrictive sensible defaults rather than unlimited.
FALLBACK = PlanLimits(2, 4096, 120, 1_000_000, 256, 1 << 30)
#: Sandbox resources a run may ask for in its limits, with their defaults and upper bounds (a
#: run asking for more is refused when it is created: api/serializers/runs.py, and
#: when spawned: api/services/procs.py; ``memory_mb`` is
#: further capped by the plan's ``max_memory_mb``).
SANDBOX_RESOURCES = {
    "memory_mb": (512, 4096),
    "pids": (128, 1024),
    "output_limit_bytes": (1 << 20, 16 << 20),
}


class PlanQuotaExceeded(Exception):
    """The run would exceed the tenant's plan; the message says which limit. The control plane's
    refusal (a 429 ``quota_exceeded``, api/errors.py), not the SDK's ``symphony.QuotaExceeded``
    that a program catches."""


class ConcurrencyLimitReached(PlanQuotaExceeded):
    """The tenant already runs as many runs as its plan allows: unlike the other limits, this
    one passes by itself when a run ends, so a caller may wait a little and try again."""


#: The Plan columns a :class:`PlanLimits` is made of, by the same names.
PLAN_LIMIT_FIELDS = tuple(PlanLimits.__dataclass_fields__)


def _quoted(model: type[Model], *fields: str) -> tuple[str, ...]:
    """``model``'s quoted table name, then the quoted columns of ``fields``: SQL written from the
    models' own names (nothing a request sends is formatted into a statement)."""
    quote = connection.ops.quote_name
    meta = model._meta
    return (quote(meta.db_table), *(quote(meta.get_field(f).column) for f in fields))


@functools.cache
def _plan_limits_sql() -> str:
    """The statement :func:`plan_limits` runs, written once a process from the model's names."""
    plan, name, *columns = _quoted(Plan, "name", *PLAN_LIMIT_FIELDS)
    return f"SELECT {', '.join(columns)} FROM {plan} WHERE {name} = %s"  # noqa: S608 (names only)


def plan_limits(tenant: Tenant) -> PlanLimits:
    """The limits of the tenant's plan (:data:`FALLBACK` when its plan has no row).

    Read on the path of every ``/v1`` answer, so as SQL written once a process, not a queryset:
    the ORM's compile and model instance cost ~2 ms of Python a statement on a 2-core host,
    for a query PostgreSQL answers in a tenth of a millisecond (bench/NOTES.md, "what an ORM
    statement costs")."""
    with connection.cursor() as cursor:
        cursor.execute(_plan_limits_sql(), [tenant.plan])
        row = cursor.fetchone()
    streams = settings.SYMPHONY_STREAMS_PER_TENANT
    if row is None:
        return replace(FALLBACK, max_concurrent_streams=streams)
    limits = dict(zip(PLAN_LIMIT_FIELDS, row, strict=True))
    limits["max_concurrent_streams"] = limits["max_concurrent_streams"] or streams
    return PlanLimits(**limits)


def kv_quota(plan: PlanLimits) -> KvQuotaLimits:
    """The tenant's bounds on its named KV files as the worker takes them (session limits and
    the admin ``kv_pin``: ``gpu_worker.protocol.KvQuotaLimits``); ``None`` = unlimited."""
    return {
        "max_stored_bytes": plan.kv_bytes_stored,
        "kv_pinned_share": plan.kv_pinned_device_share,
        "kv_host_share": plan.kv_host_share,
        "max_kv_files": plan.max_kv_files,
    }


def next_period_start(today: date) -> date:
    """The first day of the next month: when the monthly quota starts afresh."""
    return date(today.year + today.month // 12, today.month % 12 + 1, 1)


def _month_start() -> datetime:
    return timezone.now().replace(day=1, hour=0, minute=0, second=0, microsecond=0)


@functools.cache
def _month_tokens_sql() -> str:
    """The statement :func:`tokens_this_month` runs, written once a process from the model's names."""
    table, tokens, tenant, month = _quoted(MonthlyTokens, "tokens", "tenant", "month")
    return f"SELECT {tokens} FROM {table} WHERE {tenant} = %s AND {month} = %s"  # noqa: S608 (names only)


def tokens_this_month(tenant: Tenant) -> int:
    """The tenant's prompt and generated tokens this calendar month (UTC): one indexed row the
    database keeps (``MonthlyTokens``), however many runs the month had. Read twice on the path
    of every ``/v1`` answer, so as SQL written once a process (see :func:`plan_limits`)."""
    with connection.cursor() as cursor:
        cursor.execute(_month_tokens_sql(), [tenant.pk, _month_start().date()])
        row = cursor.fetchone()
    return int(row[0]) if row else 0


def tokens_this_month_of(tenant_id: OuterRef) -> Coalesce:
    """:func:`tokens_this_month` as an expression of another query's row (``tenant_id``), so a
    statement the path makes anyway reads the month's tokens with it (``runs.start_run``)."""
    month = MonthlyTokens.objects.filter(tenant_id=tenant_id, month=_month_start().date()).values("tokens")[:1]
    return Coalesce(Subquery(month, output_field=BigIntegerField()), 0)


LIVE = ("queued", "running")


def _active_runs(tenant: Tenant) -> int:
    """The tenant's live run trees: a root run with its children counts once (a tree's children
    are bounded by the plan's own caps, ``create_child``)."""
    return Run.objects.filter(tenant=tenant, status__in=LIVE, parent__isnull=True).count()


def live_descendants(root_id: object, max_depth: int) -> int:
    """Queued or running runs below ``root_id`` in its tree (at most ``max_depth`` levels)."""
    count, level = 0, [root_id]
    for _ in range(max_depth):
        rows = list(Run.objects.filter(parent_id__in=level).values_list("pk", "status"))
        if not rows:
            break
        count += sum(1 for _pk, status in rows if status in LIVE)
        level = [pk for pk, _status in rows]
    return count


def _stored_bytes(files) -> int:
    return int(files.aggregate(b=Sum("bytes"))["b"] or 0)


def current_use(tenant: Tenant) -> dict:
    own = KVFile.objects.filter(tenant=tenant)
    # The plan's ``kv_bytes_stored`` and ``max_kv_files`` bound an account's tenants together (the
    # worker counts their named files as one, gpu_worker/kvfs/budgets.py): the figures they meet.
    account = own if tenant.account_id is None else KVFile.objects.filter(tenant__account_id=tenant.account_id)
    return {
        "active_runs": _active_runs(tenant),
        "tokens_this_month": tokens_this_month(tenant),
        "kv_bytes_stored": _stored_bytes(own),
        "account_kv_bytes_stored": _stored_bytes(account),
        "kv_files": own.count(),
        "account_kv_files": account.count(),
    }


def quota_view(tenant: Tenant) -> dict:
    return {
        "plan": tenant.plan,
        "limits": asdict(plan_limits(tenant)),
        "use": current_use(tenant),
        "allowed_tool_hosts": list(tenant.allowed_tool_hosts),
        # Not a plan limit but one the console checks before uploading (api/services/programs.py).
        "max_program_bytes": settings.SYMPHONY_MAX_PROGRAM_BYTES,
    }


@functools.cache
def _lock_account_sql() -> str:
    user, pk = _quoted(get_user_model(), "id")
    return f"SELECT {pk} FROM {user} WHERE {pk} = %s FOR UPDATE"  # noqa: S608 (names only)


def lock_account(tenant: Tenant) -> None:
    """Lock the row of the account ``tenant`` counts against (its creator's user row), inside the
    caller's transaction and before the tenant's own row: creations in every tenant of one
    account then count the account's runs one at a time. A tenant with no creator of record is
    an account of its own, bounded by its tenant row lock alone. SQL written once a process:
    every run creation, each /v1 request's included, takes this lock (see :func:`plan_limits`)."""
    if tenant.account_id is not None:
        with connection.cursor() as cursor:
            cursor.execute(_lock_account_sql(), [tenant.account_id])


def account_run_cap(tenant: Tenant, plan: PlanLimits | None = None) -> int | None:
    """Concurrent runs across every open tenant the account created: the best of their plans'
    ``max_concurrent_runs`` (creating tenants adds none); ``None`` for a tenant with no account.
    ``plan``: the tenant's own plan when the caller has read it already."""
    if tenant.account_id is None:
        return None
    with connection.cursor() as cursor:
        cursor.execute(_account_cap_sql(), [tenant.account_id])
        best = cursor.fetchone()[0]
    own = (plan or plan_limits(tenant)).max_concurrent_runs  # a tenant on a plan with no row: FALLBACK
    return max(best or 0, own)


@functools.cache
def _account_cap_sql() -> str:
    """The best ``max_concurrent_runs`` of the plans of an account's open tenants, written once a
    process (on the path of every run creation)."""
    plan, cap, name = _quoted(Plan, "max_concurrent_runs", "name")
    tenant, tenant_plan, account, closed = _quoted(Tenant, "plan", "account", "closed_at")
    return (
        f"SELECT MAX({cap}) FROM {plan} WHERE {name} IN "  # noqa: S608 (names only)
        f"(SELECT {tenant_plan} FROM {tenant} WHERE {account} = %s AND {closed} IS NULL)"
    )


def _active_runs_with_account(tenant: Tenant) -> tuple[int, int]:
    """Live run trees of the tenant and across its account's tenants (a tree counts once, as
    ``_active_runs``), in one statement: both are counted on the path of every run creation."""
    with connection.cursor() as cursor:
        cursor.execute(_active_runs_with_account_sql(), [tenant.pk, tenant.account_id, *LIVE])
        own, account = cursor.fetchone()
    return int(own), int(account)


@functools.cache
def _active_runs_with_account_sql() -> str:
    """:func:`_active_runs_with_account`'s statement, written once a process."""
    run, run_pk, run_tenant, status, parent = _quoted(Run, "id", "tenant", "status", "parent")
    tenant, tenant_pk, account = _quoted(Tenant, "id", "account")
    live = ", ".join(["%s"] * len(LIVE))
    return (
        f"SELECT COUNT(r.{run_pk}) FILTER (WHERE r.{run_tenant} = %s), COUNT(r.{run_pk}) "  # noqa: S608 (names only)
        f"FROM {run} r INNER JOIN {tenant} t ON r.{run_tenant} = t.{tenant_pk} "
        f"WHERE t.{account} = %s AND r.{status} IN ({live}) AND r.{parent} IS NULL"
    )


def check_can_start(
    tenant: Tenant,
    limits: dict,
    plan: PlanLimits | None = None,
    *,
    child: bool = False,
    tokens_used: int | None = None,
) -> None:
    """Refuse a run the plan does not allow; the message names the limit. ``plan``: the
    tenant's plan when the caller has read it already. ``child``: a spawned run, which counts
    within its tree (``create_child``), not against the tenant's concurrent runs.
    ``tokens_used``: the tenant's tokens this month as the caller's request read them already
    (a /v1 request's token headers, on its first creation attempt); read here when not given.
    Either is a reading at one instant: no usage write takes the locks the creation holds, so a
    read under them is no more exact than one just before, and the worker's token cap is what
    is left at the run's start (``runs.start_run``) either way."""
    plan = plan or plan_limits(tenant)
    # Only what is checked here is counted (not current_use's KV sums): every run creation,
    # each /v1 request included, runs this under its tenant's row lock.
    # Under the account's row lock (lock_account): a person's tenants share one bound.
    account_cap = None if child else account_run_cap(tenant, plan)
    if child:
        own = account = 0
    elif account_cap is None:
        own, account = _active_runs(tenant), 0
    else:
        own, account = _active_runs_with_account(tenant)
    if not child and own >= plan.max_concurrent_runs:
        raise ConcurrencyLimitReached(f"plan {tenant.plan} allows {plan.max_concurrent_runs} concurrent runs")
    if account_cap is not None and account >= account_cap:
        raise ConcurrencyLimitReached(
            f"your account allows {account_cap} concurrent runs across all the tenants it created"
            " (the best of their plans' max_concurrent_runs); wait for one to finish"
        )
    if int(limits.get("max_tokens", 0)) > plan.max_tokens_per_run:
        raise PlanQuotaExceeded(f"max_tokens above plan limit {plan.max_tokens_per_run}")
    if float(limits.get("deadline_s", 0)) > plan.max_run_seconds:
        raise PlanQuotaExceeded(f"deadline_s above plan limit {plan.max_run_seconds}")
    if plan.tokens_per_month is not None:
        used = tokens_this_month(tenant) if tokens_used is None else tokens_used
        if used >= plan.tokens_per_month:
            raise PlanQuotaExceeded(f"monthly token quota of {plan.tokens_per_month} is used up")


def session_limits(run: Run, plan: PlanLimits | None = None, tokens_used: int | None = None) -> RunLimits:
    """The limits the worker enforces for ``run``: the run's own (validated when it was created:
    api/serializers/runs.py ``RunLimitsSerializer``), capped by the plan, with the monthly token
    allowance left as a further cap on tokens and the tenant's allowlist as the widest one.
    ``plan``: the tenant's plan as the request that created the run read it (read here when not
    given). ``tokens_used``: the tenant's tokens this month as the run's start read them
    (``runs.start_run``, in its locking statement; read here when not given)."""
    tenant = run.tenant
    plan = plan or plan_limits(tenant)
    requested = run.limits
    max_tokens = min(int(requested.get("max_tokens") or plan.max_tokens_per_run), plan.max_tokens_per_run)
    if plan.tokens_per_month is not None:
        used = tokens_this_month(tenant) if tokens_used is None else tokens_used
        max_tokens = max(0, min(max_tokens, plan.tokens_per_month - used))
    # A run that states no deadline gets its plan's (what the author's plan pays for).
    deadline = min(float(requested.get("deadline_s") or plan.max_run_seconds), float(plan.max_run_seconds))
    # A run may narrow the tenant's tool allowlist, never widen it.
    narrowed = {host_entries.spelling(h) for h in requested.get("allowed_hosts") or ()}
    hosts = [h for h in tenant.allowed_tool_hosts if "allowed_hosts" not in requested or h.lower() in narrowed]
    out: RunLimits = {
        "max_tokens": max_tokens,
        "deadline_s": deadline,
        "allowed_hosts": hosts,
        "weight": plan.scheduling_weight,
        # Pools shared by every tenant are bounded per account (gpu_worker/resource_model.py).
        "account": tenant.account_key,
    }
    pages = [p for p in (plan.max_device_pages_per_run, requested.get("max_pages")) if p is not None]
    if pages:
        out["max_pages"] = min(int(p) for p in pages)
    if requested.get("max_kv_bytes") is not None:
        out["max_kv_bytes"] = int(requested["max_kv_bytes"])
    # Every key, ``None`` included: a plan changed to unlimited lifts the worker's bound too.
    out.update(kv_quota(plan))
    if plan.stream_bytes_per_run is not None:
        out["max_stream_bytes"] = plan.stream_bytes_per_run
    return out
