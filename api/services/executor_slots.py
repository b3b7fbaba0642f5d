"""Each account's share of an executor's slots, enforced where the slots are consumed.

A Celery executor (one per worker, consuming ``worker.<name>``) runs as many runs at once as it
has slots (its concurrency), and a run holds its slot for as long as its program runs, waiting
included (``sleep``, tool I/O, a channel). Without a bound, four runs of one person that only
sleep took all four slots and every other tenant's run waited in the queue behind them.

So the executor measures its slots when it starts (:func:`record_capacity`, from Celery's
``celeryd_after_setup`` signal) and admits a run only while the run's *account*
(``Tenant.account_key``: a person's tenants are one account) holds fewer than its bound of them
(``resource_model.Pool(EXECUTOR_SLOTS, slots)``): the pool's ``ceiling`` while no other account
has runs queued for this worker, its ``fair_share`` among the active accounts while one has.
With 4 slots one account holds at most 3 (2 while another waits); with 2 slots, 1. A run over
its bound is not started: its task is sent back to the same queue ``DEFER_S`` later and the run
stays ``queued``, so the slot takes the next task at once. Runs already running are never
stopped; the account's deferred run starts when one of its own runs ends.

The slots held are leases in Redis, one sorted set per executor (``symphony:executor-slots:<node>``,
members ``<account>|<run id>``, score: the lease's expiry). Taking one is a Lua script (check the
account's count below the bound, add) so two slots of one executor never both pass the check;
the lease is refreshed while the run executes and removed when it ends, and the lease of an
executor killed mid-run expires ``LEASE_TTL_S`` later. When Redis cannot be reached the run is
executed without a lease: a Redis hiccup must not stop runs (the heartbeat does the same).

An executor of one slot (``--pool solo``) cannot keep a slot free for others: it admits every
run (docs/DEPLOY.md asks for at least two).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import redis
from django.conf import settings

from api import redis_client
from api.models import Run, Tenant
from api.services.executor_liveness import TTL_S
from gpu_worker.resource_model import Pool, PoolName

log = logging.getLogger(__name__)

#: Seconds a run over its account's bound waits before its task is tried again: the delay with
#: which an account's next run starts after one of its own ends.
DEFER_S = 1.0
#: A lease not refreshed for this long is dropped (its executor died mid-run).
LEASE_TTL_S = TTL_S
PREFIX = "symphony:executor-slots:"

#: ``(node name, slots)`` of the Celery executor of this process; ``None`` outside an executor
#: (tests calling tasks in process, a shell), where nothing is admitted or refused.
_executor: tuple[str, int] | None = None

# KEYS[1]: the executor's leases. ARGV: account prefix ("<account>|"), member, bound, TTL (s).
# Returns {1, held before} when admitted (or already leased), {0, held} when over the bound.
_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local held = 0
for _, m in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  if string.sub(m, 1, #ARGV[1]) == ARGV[1] then held = held + 1 end
end
if redis.call('ZSCORE', KEYS[1], ARGV[2]) then return {1, held - 1} end
if held >= tonumber(ARGV[3]) then return {0, held} end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[4]), ARGV[2])
redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[4])) + 1)
return {1, held}
"""
# Refresh: KEYS[1], ARGV: member, TTL (s). A lease that expired meanwhile is taken again.
_REFRESH = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[2])) + 1)
return 1
"""


def record_capacity(node: str, concurrency: int, pool_module: str) -> None:
    """Called once in the executor's main process before its pool starts (its children inherit
    it): the node's name and its slots (one for the solo pool, whatever its concurrency says)."""
    global _executor
    slots = 1 if pool_module.endswith(".solo") else max(1, int(concurrency))
    _executor = (node, slots)
    pool = Pool(PoolName.EXECUTOR_SLOTS, slots)
    if slots < 2:
        log.warning("executor_slots node=%s slots=%d: one slot cannot be shared; runs are not bounded", node, slots)
    else:
        log.info("executor_slots node=%s slots=%d account_ceiling=%d", node, slots, pool.ceiling)


def lease_key(node: str) -> str:
    return f"{PREFIX}{node}"


def _redis() -> redis.Redis:
    return redis_client.shared(settings.REDIS_URL)


@dataclass(frozen=True)
class Admission:
    """Whether a run may take a slot now, and what it was measured against (for the log)."""

    admitted: bool
    account: str = ""
    held: int = 0
    bound: int = 0
    lease: SlotLease | None = None


def _account_of(tenant_id: int, account_id: int | None) -> str:
    return Tenant(pk=tenant_id, account_id=account_id).account_key


def bound_for(account: str, worker: str, slots: int) -> int:
    """The most slots ``account`` may hold on an executor of ``slots`` for ``worker``: the
    pool's ceiling, or its fair share among the accounts with runs on this worker while another
    account has a run queued for it."""
    pool = Pool(PoolName.EXECUTOR_SLOTS, slots)
    rows = Run.objects.filter(worker=worker, status__in=("queued", "running")).values_list(
        "status", "tenant_id", "tenant__account_id"
    )
    active = {account}
    waiting = False
    for status, tenant_id, account_id in rows.distinct():
        other = _account_of(tenant_id, account_id)
        active.add(other)
        waiting = waiting or (status == "queued" and other != account)
    return pool.fair_share(1, len(active)) if waiting else pool.ceiling


def admit(run_id: str, worker: str) -> Admission:
    """Take a slot lease for ``run_id`` on this executor, or say it must wait. Runs that are
    not queued (a redelivered task, a cancelled run) are admitted without a lease: their task
    only looks at them and returns."""
    if _executor is None or _executor[1] < 2:
        return Admission(True)
    node, slots = _executor
    row = Run.objects.filter(pk=run_id).values_list("status", "tenant_id", "tenant__account_id").first()
    if row is None or row[0] != "queued":
        return Admission(True)
    account = _account_of(row[1], row[2])
    bound = bound_for(account, worker, slots)
    try:
        admitted, held = _redis().eval(
            _ACQUIRE, 1, lease_key(node), f"{account}|", f"{account}|{run_id}", bound, LEASE_TTL_S
        )
    except redis.RedisError as exc:
        log.warning("executor_slot_unchecked run=%s error=%s", run_id, exc)
        return Admission(True, account)
    if not admitted:
        return Admission(False, account, int(held), bound)
    return Admission(True, account, int(held), bound, SlotLease(node, f"{account}|{run_id}"))


class SlotLease:
    """``with lease:`` around the execution of an admitted run: removed at the end. It is
    refreshed (every ``PERIOD_S``) as a rider of the run's executor heartbeat
    (api/services/executor_liveness.py), so a running run has one refreshing thread; a lease
    whose executor died expires after ``LEASE_TTL_S``."""

    def __init__(self, node: str, member: str) -> None:
        self.key, self.member = lease_key(node), member

    def refresh(self, pipe: redis.client.Pipeline) -> None:
        pipe.eval(_REFRESH, 1, self.key, self.member, LEASE_TTL_S)

    def __enter__(self) -> SlotLease:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            _redis().zrem(self.key, self.member)
        except redis.RedisError:
            pass  # expires on its own


def defer(run_id: str, worker: str, attempt: int) -> None:
    """Send the run's task back to ``worker``'s queue, ``DEFER_S`` from now: the slot this task
    took is free for the next task as soon as this one returns (and is acked)."""
    from api import dispatch

    dispatch.task(dispatch.RUN_LIP).apply_async(
        args=[run_id], kwargs={"worker": worker, "attempt": attempt}, queue=f"worker.{worker}", countdown=DEFER_S
    )


def run_in_slot(run_id: str, target: str | None, attempt: int) -> str:
    """What the ``run_lip`` task does: admit the run on this executor (see the module docstring)
    and execute it, or defer it while its account holds its bound of slots. ``"deferred"``
    when the run was sent back to the queue (it is still ``queued``)."""
    from api.services.execution import execute_run

    worker = target or settings.SYMPHONY_WORKER_NAME
    admission = admit(run_id, worker)
    if not admission.admitted:
        try:
            defer(run_id, worker, attempt)
        except Exception as exc:  # the broker is down: running it beats losing it
            log.warning("executor_slot_defer_failed run=%s error=%s", run_id, exc)
        else:
            log.info(
                "run_deferred run=%s account=%s held=%d bound=%d retry_in_s=%.1f",
                run_id,
                admission.account,
                admission.held,
                admission.bound,
                DEFER_S,
            )
            return "deferred"
    if admission.lease is None:
        return execute_run(run_id, target=target, attempt=attempt)
    with admission.lease:
        return execute_run(run_id, target=target, attempt=attempt, riders=(admission.lease,))
