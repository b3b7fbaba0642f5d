"""One resource model for every pool that tenants share.

Each pool's *capacity* is measured by the process that owns it when it starts (the worker: device
and host KV pages, engine tokens per forward, grammar processes; the executor: its slots; the
control plane: Redis memory, stream replay memory, database connections). Every bound a tenant
meets on a shared pool is derived here from that capacity, never written as an absolute number
beside it, so no plan limit can be larger than the pool it draws from:

* **reserve**: the part of the pool that no one *account* may take (a person's tenants are one
  account: bounds that multiplied by the tenants one person can create would be no bound). It
  keeps every other active tenant able to make progress: at least ``min_reserve`` units and
  ``reserve_fraction`` of the capacity.
* **ceiling**: ``capacity - reserve``, the most one account may hold even when no one else is
  active. Below it the pool is *work-conserving*: an idle tenant's share is lent to whoever is
  busy.
* **fair share**: ``capacity * weight / sum of active weights``, what an active account is guaranteed
  while others contend. What it holds above its fair share is what the pool's owner reclaims
  (spills, stops granting anew) when another active account needs it.

Sandbox CPU is the one pool shared by weight alone: the kernel's scheduler gives each active
account's group of containers an equal share of contended cores (``PoolName.SANDBOX_CPU``).

This module is stdlib only: ``gpu_worker`` (never Django) and the control plane both import it,
so the two sides compute the same numbers. docs/ARCHITECTURE.md ("Resource model") lists which
module enforces each pool.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

#: Share of every pool held back from any one account, for the others (see the module docstring).
RESERVE_FRACTION = 0.25


class PoolName(StrEnum):
    """The shared pools, by what they count."""

    DEVICE_KV_PAGES = "device_kv_pages"
    HOST_KV_PAGES = "host_kv_pages"
    #: Bytes of named KV files the KV store keeps (its disk, measured at the worker's start).
    KV_STORE_BYTES = "kv_store_bytes"
    ENGINE_TOKENS_PER_STEP = "engine_tokens_per_step"
    EXECUTOR_SLOTS = "executor_slots"
    GRAMMAR_PROCESSES = "grammar_processes"
    REDIS_BYTES = "redis_bytes"
    REPLAY_MEMORY_BYTES = "replay_memory_bytes"
    DB_CONNECTIONS = "db_connections"
    #: The host's cores under the sandbox containers: a CPU *weight* per account (one parent
    #: cgroup each, sandbox/cpu_groups.py), not a count of units, so no ceiling or reserve is
    #: derived for it; the kernel lends an idle account's weight to the busy ones.
    SANDBOX_CPU = "sandbox_cpu"


@dataclass(frozen=True)
class Pool:
    """One shared pool of ``capacity`` units and the bounds derived from it."""

    name: PoolName
    capacity: int
    reserve_fraction: float = RESERVE_FRACTION
    min_reserve: int = 1

    def __post_init__(self) -> None:
        if self.capacity < 0:
            raise ValueError(f"{self.name}: capacity must not be negative")
        if not 0.0 <= self.reserve_fraction < 1.0:
            raise ValueError(f"{self.name}: reserve_fraction must be in [0, 1)")
        if self.min_reserve < 0:
            raise ValueError(f"{self.name}: min_reserve must not be negative")

    @property
    def reserve(self) -> int:
        """Units no one account may take (never more than the whole pool)."""
        return min(self.capacity, max(self.min_reserve, math.ceil(self.capacity * self.reserve_fraction - 1e-9)))

    @property
    def ceiling(self) -> int:
        """The most one account may hold, even alone on the pool."""
        return self.capacity - self.reserve

    def fair_share(self, weight: float, active_weight_total: float) -> int:
        """What an active account of ``weight`` is guaranteed while accounts of
        ``active_weight_total`` (its own weight included) contend, never above the ceiling and
        at least one unit where the pool has room to give one."""
        if weight <= 0 or active_weight_total <= 0:
            raise ValueError("weights must be positive")
        total = max(active_weight_total, weight)
        share = math.floor(self.capacity * weight / total + 1e-9)
        return max(min(share, self.ceiling), min(1, self.ceiling))

    def clamp(self, limit: int | None) -> int:
        """``limit`` (``None``: unlimited) cut to the ceiling: what a per-tenant or per-run bound
        on this pool may actually allow."""
        return self.ceiling if limit is None else max(0, min(limit, self.ceiling))

    def fraction_ceiling(self) -> float:
        """The ceiling as a fraction of the capacity (1.0 for an empty pool): the largest share a
        plan may name for this pool."""
        return 1.0 if self.capacity == 0 else self.ceiling / self.capacity


#: Plan limits that draw on a pool, with how each is compared to it: ``"units"`` (an absolute
#: count of the pool's units) or ``"fraction"`` (a share of its capacity).
PLAN_LIMIT_POOLS: Mapping[str, tuple[PoolName, str]] = {
    "max_device_pages_per_run": (PoolName.DEVICE_KV_PAGES, "units"),
    "kv_pinned_device_share": (PoolName.DEVICE_KV_PAGES, "fraction"),
    "kv_host_share": (PoolName.HOST_KV_PAGES, "fraction"),
    "stream_bytes_per_run": (PoolName.REDIS_BYTES, "units"),
    "kv_bytes_stored": (PoolName.KV_STORE_BYTES, "units"),
}


def plan_problems(
    plan_name: str, limits: Mapping[str, float | int | None], pools: Mapping[PoolName, Pool]
) -> list[str]:
    """Why ``limits`` (a plan's, by field name) cannot be served by ``pools``: one sentence per
    limit larger than what one account may take of the pool it draws from. Pools not given are
    not checked (their owner has not reported a capacity)."""
    problems = []
    for field, (pool_name, kind) in PLAN_LIMIT_POOLS.items():
        value = limits.get(field)
        pool = pools.get(pool_name)
        if value is None or pool is None:
            continue
        if kind == "units" and value > pool.ceiling:
            problems.append(
                f"plan {plan_name!r}: {field}={value} exceeds what one account may take of "
                f"{pool_name} ({pool.ceiling} of {pool.capacity}, {pool.reserve} reserved for others)"
            )
        elif kind == "fraction" and value > pool.fraction_ceiling() + 1e-9:
            problems.append(
                f"plan {plan_name!r}: {field}={value} exceeds the largest share of {pool_name} "
                f"one account may take ({pool.fraction_ceiling():.2f})"
            )
    return problems
