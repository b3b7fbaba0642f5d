"""The shared resource model: reserve, ceiling and fair share derived from a pool's capacity,
and plan limits checked against the pools they draw from."""

from __future__ import annotations

import pytest

from gpu_worker.resource_model import Pool, PoolName, plan_problems

DEVICE = PoolName.DEVICE_KV_PAGES


def test_the_reserve_is_a_fraction_of_the_capacity_and_at_least_the_minimum() -> None:
    assert Pool(DEVICE, 181).reserve == 46  # ceil(181 / 4)
    assert Pool(DEVICE, 181).ceiling == 135
    assert Pool(PoolName.EXECUTOR_SLOTS, 2).reserve == 1  # the minimum beats 0.5
    assert Pool(PoolName.EXECUTOR_SLOTS, 1).ceiling == 0  # one slot: nobody may hold it alone
    assert Pool(DEVICE, 0).reserve == 0


def test_a_fair_share_divides_the_capacity_by_active_weight_and_never_passes_the_ceiling() -> None:
    pool = Pool(DEVICE, 100)
    assert pool.fair_share(1, 1) == 75  # alone: the ceiling, not the whole pool
    assert pool.fair_share(1, 2) == 50
    assert pool.fair_share(1, 4) == 25
    assert pool.fair_share(3, 4) == 75
    assert Pool(PoolName.EXECUTOR_SLOTS, 4).fair_share(1, 100) == 1  # at least one unit
    with pytest.raises(ValueError):
        pool.fair_share(0, 1)


def test_a_limit_is_clamped_to_the_ceiling() -> None:
    pool = Pool(DEVICE, 181)
    assert pool.clamp(256) == 135
    assert pool.clamp(64) == 64
    assert pool.clamp(None) == 135


def test_a_plan_larger_than_its_pool_is_named() -> None:
    pools = {DEVICE: Pool(DEVICE, 181), PoolName.HOST_KV_PAGES: Pool(PoolName.HOST_KV_PAGES, 4096)}
    problems = plan_problems(
        "free",
        {"max_device_pages_per_run": 256, "kv_pinned_device_share": 0.1, "kv_host_share": 0.9},
        pools,
    )
    assert len(problems) == 2
    assert "max_device_pages_per_run=256" in problems[0] and "135 of 181" in problems[0]
    assert "kv_host_share=0.9" in problems[1]
    assert plan_problems("free", {"max_device_pages_per_run": 100, "stream_bytes_per_run": 1 << 40}, pools) == []
