"""Tenants pinning KV files on a real worker with a small page pool (the issue's attack: 32 pinned
named files x 11 runs left 10 of 363 pages free, and other tenants' prefills failed with ENOSPC).
One tenant's pins stop at its plan's share of the device pool with EDQUOT, and the pins of many
tenants (one person may own several) at the worker's bound on all pinned pages; the attacker then
fills the rest of the pool with unpinned files; another tenant's prefill of a long prompt still
succeeds, the unpinned files being spilled for it, and the worker stays healthy."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gpu_worker.protocol import ErrorCode
from gpu_worker.resource_model import Pool, PoolName
from tests.plugins.worker import RunningWorker, start_worker

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.timeout(300)]

#: The free plan's bounds (api/migrations/0012_plan_kv_shares.py) as the control plane sends them.
FREE = {"kv_pinned_share": 0.1, "kv_host_share": 0.1, "max_kv_files": 100, "max_stored_bytes": 1 << 30}
NUM_PAGES = 64
MAX_RUNS, FILES_PER_RUN = 11, 32  # the counts, as the bound of the attack
CANARY_BOUND_S = 60.0


def _full(worker: RunningWorker) -> int:
    """Free pages below which the pool is as full as one account may make it: the reserve that no
    account may take (gpu_worker/kvfs/accounts.py), and a page for rounding."""
    health = worker.admin.health()
    return Pool(PoolName.DEVICE_KV_PAGES, health["pages_total"]).reserve + 2


def _attack(worker: RunningWorker, tenant: str, pin: bool) -> Exception | None:
    """Runs of ``tenant`` that write two-page named files and pin each until a pin is refused
    (``pin``), until the pool is as full as one account may make it; returns the refusal."""
    import symphony as sy

    block = worker.admin.health()["block_size"]
    full = _full(worker)
    refused = None
    for _run in range(MAX_RUNS):
        with worker.session(tenant, **FREE) as info:
            lip = sy.connect(info.socket_path, info.token)
            try:
                for _ in range(FILES_PER_RUN):
                    if worker.admin.health()["pages_free"] < full or (pin and refused is not None):
                        return refused
                    name = f"doc{len(worker.admin.kv_list(tenant))}"
                    kv = lip.kv_create(name)
                    lip.pred(kv, list(range(100, 100 + 2 * block)))[-1].release()
                    kv.close()
                    if pin and refused is None:
                        try:
                            lip.kv_pin(name)
                        except sy.QuotaExceeded as exc:
                            refused = exc
            finally:
                lip.close()
    return refused


def _pinned_pages(worker: RunningWorker, tenant: str) -> int:
    block = worker.admin.health()["block_size"]
    return sum(-(-f["tokens"] // block) for f in worker.admin.kv_list(tenant) if f["pinned"])


def _canary_prefill(worker: RunningWorker, n_tokens: int) -> None:
    """Another tenant's prefills of ``n_tokens`` in two conversations succeed within the bound:
    more pages than the reserve the attacker's account had to leave free, so the unpinned files
    are spilled for them."""
    import symphony as sy

    prompt = [(7 * i + 3) % 4000 + 30 for i in range(n_tokens)]
    started = time.monotonic()
    with worker.session("bystander", **FREE) as info:
        canary = sy.connect(info.socket_path, info.token)
        try:
            for first in (1, 2):  # no shared prefix: each conversation needs pages of its own
                kv = canary.kv_create()
                canary.pred(kv, [first, *prompt[1:]])[-1].release()
                assert len(kv) == len(prompt)
        finally:
            canary.close()
    assert time.monotonic() - started < CANARY_BOUND_S


def _spilled_unpinned_only(worker: RunningWorker, tenants: list[str]) -> None:
    files = [f for t in tenants for f in worker.admin.kv_list(t)]
    assert all(f["residency"] == "device" for f in files if f["pinned"]), files
    assert any(f["residency"] != "device" for f in files if not f["pinned"]), files


def test_one_tenants_pins_stop_at_its_share_and_another_tenants_long_prefill_succeeds(tiny_model_dir: Path) -> None:
    with start_worker(tiny_model_dir, name="kv-pin-share", num_pages=NUM_PAGES) as worker:
        health = worker.admin.health()
        usable, block = health["pages_total"], health["block_size"]
        share = int(FREE["kv_pinned_share"] * usable)

        refused = _attack(worker, "attacker", pin=True)
        assert refused is not None, f"the attacker pinned {_pinned_pages(worker, 'attacker')} pages unrefused"
        assert refused.code == ErrorCode.QUOTA and "share of the device pool" in refused.message
        assert _pinned_pages(worker, "attacker") <= share
        _attack(worker, "attacker", pin=False)  # the rest of the pool: unpinned files
        assert worker.admin.health()["pages_free"] < _full(worker), "the attack did not fill the pool"

        _canary_prefill(worker, min(2000, (usable - share - 1) * block))
        _spilled_unpinned_only(worker, ["attacker"])
        worker.assert_alive()


def test_many_tenants_pins_stop_at_the_worker_bound(tiny_model_dir: Path) -> None:
    """Ten free tenants at a tenth each would pin the whole pool; the worker stops them at half."""
    with start_worker(tiny_model_dir, name="kv-pin-many", num_pages=NUM_PAGES) as worker:
        health = worker.admin.health()
        usable, block = health["pages_total"], health["block_size"]
        bound = int(0.5 * usable)  # SYMPHONY_KV_PINNED_FRACTION's default
        tenants = [f"sybil{i}" for i in range(10)]

        refusals = [_attack(worker, tenant, pin=True) for tenant in tenants]
        across = [r for r in refusals if r is not None and "all tenants on this worker" in r.message]
        assert across, [str(r) for r in refusals]
        assert all(r.code == ErrorCode.QUOTA for r in across)
        assert sum(_pinned_pages(worker, t) for t in tenants) <= bound
        _attack(worker, tenants[0], pin=False)
        assert worker.admin.health()["pages_free"] < _full(worker), "the attack did not fill the pool"

        _canary_prefill(worker, min(2000, (usable - bound - 1) * block))
        _spilled_unpinned_only(worker, tenants)
        worker.assert_alive()
