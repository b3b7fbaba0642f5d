"""Per-account bounds on the device page pool (gpu_worker/kvfs/accounts.py): an account holds at
most the pool's ceiling alone, its tenants share one bound, and under contention the account
above its fair share is the one refused, never the other account whose files stay on device."""

from __future__ import annotations

import pytest

from gpu_worker.kvfs import NoSpace, Owner, PoolFull
from gpu_worker.resource_model import Pool, PoolName
from tests.kvfs.memio import BLOCK, append, make_fs

NUM_PAGES = 17  # 16 usable: reserve 4, ceiling 12, two equal accounts' fair share 8
POOL = Pool(PoolName.DEVICE_KV_PAGES, NUM_PAGES - 1)
ATTACKER = Owner("free-a", "s1")
ATTACKER_TWIN = Owner("free-b", "s1")  # another tenant of the same person
VICTIM = Owner("victim", "s1")


def _fork_attack(fs, io, owner: Owner, limit: int = 64) -> PoolFull:
    """The issue's attack: fork one file again and again, one token each (a COW page apiece)."""
    base = fs.create(owner)
    append(fs, io, owner, base, [1])
    for _ in range(limit):
        child = fs.fork(owner, base)
        try:
            append(fs, io, owner, child, [2])
        except PoolFull as exc:
            return exc
    raise AssertionError(f"no refusal after {limit} forks")


def test_one_account_alone_stops_at_the_pool_ceiling(tmp_path):
    fs, io = make_fs(tmp_path, num_pages=NUM_PAGES)
    fs.set_session_limit(ATTACKER, 10_000, account="u1")  # a plan's per-run cap above the pool
    refused = _fork_attack(fs, io, ATTACKER)
    assert POOL.ceiling == 12 and fs.alloc.tenant_pages("free-a") == POOL.ceiling
    assert fs.stats().free_pages == POOL.reserve
    assert isinstance(refused, NoSpace)  # ENOSPC on the wire, like every page refusal
    assert f"this account holds 12 of the worker's {POOL.capacity} device pages" in refused.message
    fs.close_session(ATTACKER)
    fs.check()


def test_a_worker_serving_one_account_may_keep_no_reserve(tmp_path):
    """``--kv-account-reserve 0`` (a dedicated worker, or a benchmark against a single-tenant
    baseline given the same pool): one account may take every page."""
    fs, io = make_fs(tmp_path, num_pages=NUM_PAGES, account_reserve_fraction=0.0)
    fs.set_session_limit(ATTACKER, 10_000, account="u1")
    base = fs.create(ATTACKER)
    append(fs, io, ATTACKER, base, [1])
    for _ in range(NUM_PAGES - 2):  # every usable page but the base's
        append(fs, io, ATTACKER, fs.fork(ATTACKER, base), [2])
    assert fs.alloc.tenant_pages("free-a") == NUM_PAGES - 1 and fs.stats().free_pages == 0
    fs.close_session(ATTACKER)
    fs.check()


def test_two_tenants_of_one_account_share_one_bound(tmp_path):
    fs, io = make_fs(tmp_path, num_pages=NUM_PAGES)
    fs.set_session_limit(ATTACKER, None, account="u1")
    fs.set_session_limit(ATTACKER_TWIN, None, account="u1")
    h = fs.create(ATTACKER)
    append(fs, io, ATTACKER, h, list(range(8 * BLOCK)))  # 8 pages
    refused = _fork_attack(fs, io, ATTACKER_TWIN)
    held = fs.alloc.tenant_pages("free-a") + fs.alloc.tenant_pages("free-b")
    assert held == POOL.ceiling and fs.alloc.tenant_pages("free-b") == POOL.ceiling - 8
    assert "this account holds 12" in refused.message
    fs.close_session(ATTACKER)
    fs.close_session(ATTACKER_TWIN)
    fs.check()


def test_under_contention_the_account_over_its_share_is_refused_and_the_other_keeps_its_files(tmp_path):
    fs, io = make_fs(tmp_path, num_pages=NUM_PAGES)
    fs.set_session_limit(VICTIM, None, account="u2")
    doc = fs.create(VICTIM, "doc")
    append(fs, io, VICTIM, doc, list(range(3 * BLOCK)))  # 3 pages, idle once closed
    fs.close(VICTIM, doc)
    fs.set_session_limit(ATTACKER, None, account="u1")

    refused = _fork_attack(fs, io, ATTACKER)
    share = POOL.fair_share(1.0, 2.0)
    assert share == 8 and "its share under contention is 8" in refused.message
    # Above its share it took only what left the reserve free; the victim's file stayed on device.
    assert fs.alloc.tenant_pages("free-a") == POOL.capacity - 3 - POOL.reserve
    assert [f.residency for f in fs.list_files("victim")] == ["device"]

    # The victim's prefill + decode gets its pages from the reserve.
    h = fs.create(VICTIM)
    append(fs, io, VICTIM, h, list(range(3 * BLOCK)))
    for t in range(BLOCK):
        append(fs, io, VICTIM, h, [100 + t])
    assert fs.length(VICTIM, h) == 4 * BLOCK
    assert [f.residency for f in fs.list_files("victim")] == ["device"]
    fs.close_session(VICTIM)
    fs.close_session(ATTACKER)
    fs.check()


def test_a_spill_for_an_account_within_its_share_takes_the_over_share_accounts_files_first(tmp_path):
    fs, io = make_fs(tmp_path, num_pages=NUM_PAGES, host_pages=32)
    fs.set_session_limit(VICTIM, None, account="u2")
    mine = fs.create(VICTIM, "mine")
    append(fs, io, VICTIM, mine, list(range(2 * BLOCK)))
    fs.close_session(VICTIM)  # its file is idle, and older than the attacker's
    fs.set_session_limit(ATTACKER, None, account="u1")
    for i in range(3):  # alone on the pool: 12 pages of idle named files, its ceiling
        h = fs.create(ATTACKER, f"f{i}")
        append(fs, io, ATTACKER, h, list(range(4 * BLOCK)))
        fs.close(ATTACKER, h)
    assert fs.stats().free_pages == 2

    fs.set_session_limit(VICTIM, None, account="u2")  # now it contends: the attacker is over its 8
    h = fs.create(VICTIM)
    append(fs, io, VICTIM, h, list(range(6 * BLOCK)))  # 4 more than are free
    assert [f.residency for f in fs.list_files("victim")] == ["device"]  # plain LRU would spill it
    assert [f.residency for f in fs.list_files("free-a")] == ["host", "device", "device"]
    fs.close_session(VICTIM)
    fs.close_session(ATTACKER)
    fs.check()


def test_no_session_no_account_bound(tmp_path):
    """KVFS used on its own (no run registered an account) is bounded by the pool alone."""
    fs, io = make_fs(tmp_path, num_pages=NUM_PAGES)
    h = fs.create(ATTACKER)
    append(fs, io, ATTACKER, h, list(range(16 * BLOCK)))
    with pytest.raises(PoolFull, match="KV cache full"):
        fs.plan_append(ATTACKER, h, [1])
    fs.close_session(ATTACKER)
