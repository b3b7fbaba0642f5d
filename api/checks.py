"""System checks (``manage.py check --deploy``) that compare the plans with the pools
the live workers measured: a plan limit larger than what one account may take of the pool it
draws from (gpu_worker/resource_model.py ``plan_problems``) is an error, since the worker would
clamp it anyway and the plan would promise what no tenant can get. The workers report their
pools in their heartbeats (``pages_total``: the device KV pool; ``kv_store_bytes``: the KV
store's bytes for named files); with no live worker there is
nothing to compare for those. The retained event streams' pool is read here from the Redis the
control plane and the workers share: its ``maxmemory`` now, sized as the worker sizes it
(gpu_worker/stream_ledger.py ``StreamBudget``), so a plan whose ``stream_bytes_per_run`` is more
than one account may hold of it is refused too; an unreachable Redis is nothing to compare.

The database connections are a pool too, and not the web process's alone: each web process
has its own pool of ``DATABASE_POOL_MAX_SIZE`` (the per-account share of api/services/db_share.py
divides that one), and every process of the deploy draws from PostgreSQL's ``max_connections``.
So the deploy says how many web processes it runs (``SYMPHONY_WEB_PROCESSES``, all hosts
together) and how many connections everything else may hold (``SYMPHONY_OTHER_DB_CONNECTIONS``:
Celery executors, beat, migrations, an operator's shell), and a sum larger than what the server,
asked now, lets non-superusers open is an error (``api.E102``): past it a web process's pool
would wait for connections PostgreSQL refuses, and the share would promise what no pool has."""

from __future__ import annotations

import os
from typing import Any

import redis
from django.conf import settings
from django.core import checks
from django.db import DatabaseError, connection

from gpu_worker.resource_model import PLAN_LIMIT_POOLS, Pool, PoolName, plan_problems
from gpu_worker.stream_ledger import StreamBudget

#: The check's id in ``manage.py check`` output (and ``SILENCED_SYSTEM_CHECKS``).
PLAN_EXCEEDS_POOL = "api.E101"
#: The web processes' pools and the other connections exceed PostgreSQL's ``max_connections``.
CONNECTIONS_EXCEED_SERVER = "api.E102"
#: The web process's pool when ``DATABASE_POOL_MAX_SIZE`` is not set (web/asgi.py sets it so).
WEB_POOL_DEFAULT = 16


def _smallest_pools() -> dict[PoolName, Pool]:
    """The pools of the smallest live worker: a run may go to any of them."""
    from api.services import routing

    workers = [w for w in routing.live_workers() if w.pages_total > 0]
    if not workers:
        return {}
    smallest = min(workers, key=lambda w: w.pages_total)
    pools = {PoolName.DEVICE_KV_PAGES: Pool(PoolName.DEVICE_KV_PAGES, smallest.pages_total)}
    stores = [int(w.health["kv_store_bytes"]) for w in workers if w.health.get("kv_store_bytes") is not None]
    if stores:
        pools[PoolName.KV_STORE_BYTES] = Pool(PoolName.KV_STORE_BYTES, min(stores))
    return pools


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


def web_pool_size() -> int:
    """Connections one web process's pool may hold: ``DATABASE_POOL_MAX_SIZE`` as the web process
    reads it (web/asgi.py defaults it to 16; ``manage.py`` runs without a pool of its own)."""
    return int(os.environ.get("DATABASE_POOL_MAX_SIZE") or WEB_POOL_DEFAULT)


def server_connection_limit() -> int | None:
    """Connections PostgreSQL lets the deploy's role open now: ``max_connections`` less those
    reserved for superusers (and, from PostgreSQL 16, ``reserved_connections``); ``None`` when
    the server cannot be asked."""
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT current_setting('max_connections')::int"
                " - current_setting('superuser_reserved_connections')::int"
                " - coalesce(current_setting('reserved_connections', true), '0')::int"
            )
            row = cursor.fetchone()
    except DatabaseError:
        return None
    return int(row[0]) if row else None


@checks.register(checks.Tags.database, deploy=True)
def db_connections_fit_the_server(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Every web process's pool, plus the deploy's other connections, within ``max_connections``."""
    pool = web_pool_size()
    if pool <= 0:  # a connection per request: nothing is pooled (or shared out) to compare
        return []
    limit = server_connection_limit()
    if limit is None:
        return []
    processes, others = settings.SYMPHONY_WEB_PROCESSES, settings.SYMPHONY_OTHER_DB_CONNECTIONS
    needed = processes * pool + others
    if needed <= limit:
        return []
    return [
        checks.Error(
            f"{processes} web processes x {pool} pooled connections (DATABASE_POOL_MAX_SIZE) + {others} other"
            f" connections (SYMPHONY_OTHER_DB_CONNECTIONS) = {needed}, more than the {limit} PostgreSQL allows"
            " (max_connections less its reserved connections): the web processes' pools would wait for"
            " connections the server refuses",
            hint="raise max_connections, run fewer web processes (SYMPHONY_WEB_PROCESSES) or give each a"
            " smaller pool (DATABASE_POOL_MAX_SIZE)",
            id=CONNECTIONS_EXCEED_SERVER,
        )
    ]
