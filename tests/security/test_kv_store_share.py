"""The KV store's bytes are a pool with a per-account bound (``PoolName.KV_STORE_BYTES``).

Before, a plan's stored bytes bound each tenant alone: one person's ten tenants kept ten times
the plan, and nothing bounded everyone's named files by the disk they fill. Through a real
worker: two tenants of one account share the plan's stored bytes (the second is refused with an
ENOSPC that names the account), a tenant of another account still stores its file, one account
with a plan larger than the store stops at the store pool's ceiling, and another account still
stores within the reserve.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_worker.resource_model import Pool, PoolName
from tests.plugins.worker import RunningWorker, start_worker

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.timeout(300)]

LIMITS = {"max_tokens": 100_000, "max_kv_files": 100}


@pytest.fixture(scope="module")
def worker(tiny_model_dir: Path) -> Iterator[RunningWorker]:
    with start_worker(tiny_model_dir, name="kv-store-share") as running:
        yield running


def _store(lip, name: str, pages: int, block: int, start: int = 100) -> None:
    """A named file of ``pages`` full pages, written to the store when closed."""
    kv = lip.kv_create(name)
    try:
        lip.pred(kv, list(range(start, start + pages * block)))[-1].release()
    finally:
        kv.close()


def _page_bytes(worker: RunningWorker, block: int) -> int:
    import symphony as sy

    with worker.session("measure", account="u-measure", **LIMITS) as info:
        lip = sy.connect(info.socket_path, info.token)
        try:
            _store(lip, "one", 1, block)
        finally:
            lip.close()
    (row,) = worker.admin.kv_list("measure")
    worker.admin.kv_delete("measure", "one")
    return int(row["bytes"])


def test_two_tenants_of_one_account_share_the_plans_stored_bytes(worker) -> None:
    import symphony as sy

    block = worker.admin.health()["block_size"]
    page = _page_bytes(worker, block)
    plan = {**LIMITS, "max_stored_bytes": 6 * page}
    with (
        worker.session("store-one", account="u-hoarder", **plan) as one_info,
        worker.session("store-two", account="u-hoarder", **plan) as two_info,
        worker.session("store-other", account="u-other", **plan) as other_info,
    ):
        one = sy.connect(one_info.socket_path, one_info.token)
        two = sy.connect(two_info.socket_path, two_info.token)
        other = sy.connect(other_info.socket_path, other_info.token)
        try:
            _store(one, "a", 4, block)
            _store(two, "b", 2, block)  # 6 pages across the account: the plan exactly
            with pytest.raises(sy.NoSpace) as refused:
                _store(two, "c", 1, block, start=900)
            assert "account's (2 tenants together)" in str(refused.value), refused.value
            assert f"past the plan's {6 * page}" in str(refused.value), refused.value
            # Another person's tenant on the same plan stores all of its own budget.
            _store(other, "mine", 6, block)
        finally:
            for lip in (one, two, other):
                lip.close()
    assert sum(f["bytes"] for f in worker.admin.kv_list("store-other")) == 6 * page
    worker.assert_alive()


def test_one_account_stops_at_the_store_pools_ceiling_and_leaves_the_reserve(tiny_model_dir: Path, worker) -> None:
    import symphony as sy

    block = worker.admin.health()["block_size"]
    page = _page_bytes(worker, block)
    capacity = 8 * page
    pool = Pool(PoolName.KV_STORE_BYTES, capacity)
    rich = {**LIMITS, "max_stored_bytes": 100 * page}  # a plan far past the store
    with start_worker(tiny_model_dir, name="kv-store-small", extra_args=["--kv-store-bytes", str(capacity)]) as small:
        assert small.admin.health()["kv_store_bytes"] == capacity
        with (
            small.session("hoard", account="u-hoard", **rich) as h_info,
            small.session("later", account="u-later", **rich) as l_info,
        ):
            hoard = sy.connect(h_info.socket_path, h_info.token)
            later = sy.connect(l_info.socket_path, l_info.token)
            try:
                stored = 0
                with pytest.raises(sy.NoSpace) as refused:
                    for n in range(20):
                        _store(hoard, f"f{n}", 1, block, start=100 + n)
                        stored += 1
                assert stored * page <= pool.ceiling < (stored + 1) * page, (stored, pool)
                assert "one account may keep of this worker's KV store" in str(refused.value), refused.value
                # The reserve is the other accounts': another person's file is stored.
                _store(later, "mine", 1, block)
            finally:
                hoard.close()
                later.close()
        assert [f["name"] for f in small.admin.kv_list("later")] == ["mine"]
        small.assert_alive()
