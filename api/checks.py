"""System checks (``manage.py check --deploy``) that compare the plans with the pools
the live workers measured: a plan limit larger than what one account may take of the pool it
draws from (gpu_worker/resource_model.py ``plan_problems``) is an error, since the worker would
clamp it anyway and the plan would promise what no tenant can get. The workers report their
pools in their heartbeats (``pages_total``: the device KV pool); with no live worker there is
nothing to compare for those. The retained event streams' pool is read here from the Redis the
control plane and the workers share: its ``maxmemory`` now, sized as the worker sizes it
(gpu_worker/stream_ledger.py ``StreamBudget``), so a plan whose ``stream_bytes_per_run`` is more
than one account may hold of it is refused too; an unreachable Redis is nothing to compare."""

from __future__ import annotations

from typing import Any

import redis
from django.conf import settings
from django.core import checks
from django.db import DatabaseError

from gpu_worker.resource_model import PLAN_LIMIT_POOLS, Pool, PoolName, plan_problems
from gpu_worker.stream_ledger import StreamBudget

#: The check's id in ``manage.py check`` output (and ``SILENCED_SYSTEM_CHECKS``).
PLAN_EXCEEDS_POOL = "api.E101"


def _smallest_pools() -> dict[PoolName, Pool]:
    """The pools of the smallest live worker: a run may go to any of them."""
    from api.services import routing

    workers = [w for w in routing.live_workers() if w.pages_total > 0]
    if not workers:
        return {}
    smallest = min(workers, key=lambda w: w.pages_total)
    return {PoolName.DEVICE_KV_PAGES: Pool(PoolName.DEVICE_KV_PAGES, smallest.pages_total)}


def _redis_stream_pool() -> dict[PoolName, Pool]:
    """The pool of Redis memory for retained event streams, from Redis's ``maxmemory`` (0:
    unbounded, the worker's fallback) with the worker's default headroom."""
    try:
        client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=5, socket_connect_timeout=5)
        try:
            maxmemory = int(client.info("memory").get("maxmemory", 0))  # as the worker reads it
        finally:
            client.close()
    except (redis.RedisError, ValueError):
        return {}
    return {PoolName.REDIS_BYTES: StreamBudget().pool(maxmemory)}


# A deploy check (``check --deploy``) only: it reads whatever workers are live now, so run by
# ``migrate`` it would stop a migration because some small worker (a test's, a benchmark's)
# heartbeats while it runs.
@checks.register(checks.Tags.compatibility, deploy=True)
def plan_limits_fit_the_workers_pools(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Every plan limit within what one account may take of the live workers' pools."""
    from api.models import Plan

    pools = {**_smallest_pools(), **_redis_stream_pool()}
    if not pools:
        return []
    try:
        plans = list(Plan.objects.all())
    except DatabaseError:  # not migrated yet (the check runs before ``migrate`` too)
        return []
    fields = list(PLAN_LIMIT_POOLS)
    return [
        checks.Error(
            problem,
            hint="lower the plan's limit (Django admin, Plans) or give the workers (or Redis) larger pools",
            obj=plan,
            id=PLAN_EXCEEDS_POOL,
        )
        for plan in plans
        for problem in plan_problems(plan.name, {f: getattr(plan, f, None) for f in fields}, pools)
    ]
