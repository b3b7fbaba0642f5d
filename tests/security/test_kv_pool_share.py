"""The device KV pool is shared per account, bounded from its capacity (the issue's attack: the free
plan allowed 256 device pages per run on a worker whose pool had 181; one run forked a file 162
times, one token each, took every free page, pushed ~104 pages of other tenants' files to host,
and another tenant's runs failed with ENOSPC). Through a real worker with the issue's pool: the
attack stops at its account's bound with an ENOSPC naming it, another tenant's prefill + decode
succeeds and its files stay on device; two tenants of one person share one bound; the run's
``kv`` event carries only its own and its tenant's pages, not the worker's totals."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from gpu_worker.resource_model import Pool, PoolName
from tests.conftest import redis_db_url, wait_for
from tests.plugins.worker import RunningWorker, start_worker

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.timeout(300)]

NUM_PAGES = 181  # the worker pool (pages_total 180: page 0 is the engine's)
#: The free plan as the control plane sends it (api/services/quotas.py session_limits).
FREE = {"max_pages": 256, "max_tokens": 100_000, "kv_host_share": 0.1, "max_kv_files": 100}
MAX_FORKS = 400


@pytest.fixture(scope="module")
def worker(tiny_model_dir: Path) -> Iterator[RunningWorker]:
    with start_worker(tiny_model_dir, name="kv-pool-share", num_pages=NUM_PAGES) as running:
        yield running


def _pool(worker: RunningWorker) -> Pool:
    return Pool(PoolName.DEVICE_KV_PAGES, worker.admin.health()["pages_total"])


def _fork_attack(lip) -> tuple[int, Exception]:
    """Fork one file again and again, one token each (one copy-on-write page apiece), until
    refused; returns the pages the run got and the refusal."""
    import symphony as sy

    base = lip.kv_create()
    lip.pred(base, [5])[-1].release()
    pages = 1
    for _ in range(MAX_FORKS):
        child = base.fork()
        try:
            lip.pred(child, [6])[-1].release()
        except sy.NoSpace as exc:
            return pages, exc
        pages += 1
    raise AssertionError(f"{MAX_FORKS} forks of one token each were never refused")


def _prefill_and_decode(lip, n_prompt: int, n_decode: int) -> int:
    kv = lip.kv_create()
    dist = lip.pred(kv, [(7 * i + 3) % 4000 + 30 for i in range(n_prompt)])[-1]
    for _ in range(n_decode):
        token = dist.argmax()
        dist.release()
        dist = lip.pred(kv, [token])[-1]
    dist.release()
    return len(kv)


def test_one_runs_fork_attack_stops_at_its_accounts_bound_and_another_tenants_run_succeeds(worker) -> None:
    import symphony as sy

    pool, block = _pool(worker), worker.admin.health()["block_size"]
    with worker.session("victim", account="u-victim", **FREE) as v_info:
        victim = sy.connect(v_info.socket_path, v_info.token)
        notes = victim.kv_create("notes")
        victim.pred(notes, list(range(100, 100 + 4 * block)))[-1].release()
        notes.close()  # idle on device: the attack pushed such files to host
        with worker.session("free-attacker", account="u-attacker", **FREE) as a_info:
            attacker = sy.connect(a_info.socket_path, a_info.token)
            try:
                got, refused = _fork_attack(attacker)
                share = pool.fair_share(1.0, 2.0)
                # Above its share while the victim is active, it took only what left the reserve free.
                assert got == pool.capacity - 4 - pool.reserve, (got, pool)
                assert isinstance(refused, sy.KVPoolFull) and isinstance(refused, sy.NoSpace)
                assert f"this account holds {got} of the worker's {pool.capacity} device pages" in refused.message
                assert f"its share under contention is {share}" in refused.message
                assert [f["residency"] for f in worker.admin.kv_list("victim")] == ["device"]

                # While the attacker holds all it got: another tenant's prefill + decode succeeds.
                assert _prefill_and_decode(victim, 300, 24) == 324
                assert [f["residency"] for f in worker.admin.kv_list("victim")] == ["device"]
            finally:
                attacker.close()
        victim.close()
    worker.assert_alive()


def test_alone_on_the_worker_a_run_stops_at_the_ceiling_not_the_plans_256_pages(worker) -> None:
    import symphony as sy

    pool = _pool(worker)
    with worker.session("free-solo", account="u-solo", **FREE) as info:
        lip = sy.connect(info.socket_path, info.token)
        try:
            got, refused = _fork_attack(lip)
        finally:
            lip.close()
    assert got == pool.ceiling < FREE["max_pages"], (got, pool)
    assert f"this account holds {pool.ceiling} of the worker's {pool.capacity}" in str(refused)
    assert worker.admin.health()["pages_free"] >= pool.capacity - 4  # all given back at the end


def test_two_tenants_of_one_account_share_one_bound(worker) -> None:
    import symphony as sy

    pool, block = _pool(worker), worker.admin.health()["block_size"]
    with (
        worker.session("twin-one", account="u-twin", **FREE) as one_info,
        worker.session("twin-two", account="u-twin", **FREE) as two_info,
    ):
        one = sy.connect(one_info.socket_path, one_info.token)
        two = sy.connect(two_info.socket_path, two_info.token)
        try:
            for i in range(4):  # 40 pages, in files within the model's context (no shared prefix)
                held = one.kv_create()
                one.pred(held, [100 + i, *range(100, 100 + 10 * block - 1)])[-1].release()
            got, refused = _fork_attack(two)
        finally:
            one.close()
            two.close()
    assert got == pool.ceiling - 40, (got, pool)
    assert f"this account holds {pool.ceiling} of the worker's {pool.capacity}" in str(refused)


def test_the_kv_event_carries_only_the_runs_and_its_tenants_pages(worker) -> None:
    """The issue read other tenants' prompt sizes off the worker-wide ``device_pages`` of its
    own run's events (+2, +10, +21 pages for their 288/1,236/2,641-token prompts)."""
    import symphony as sy

    block = worker.admin.health()["block_size"]
    run_id = f"r-{uuid.uuid4().hex[:8]}"
    events = redis.Redis.from_url(redis_db_url(0))
    stream = f"run:{run_id}"

    def kv_events() -> list[dict]:
        return [json.loads(f[b"data"]) for _, f in events.xrange(stream) if f[b"type"] == b"kv"]

    info = worker.create_session("spy", run_id=run_id, account="u-spy", **FREE)
    spy = sy.connect(info.socket_path, info.token)
    try:
        kv = spy.kv_create()
        spy.pred(kv, list(range(100, 100 + 2 * block)))[-1].release()
        wait_for(lambda: kv_events(), timeout=10, message="a kv event")
        with worker.session("bystander", account="u-bystander", **FREE) as b_info:
            bystander = sy.connect(b_info.socket_path, b_info.token)
            try:
                other = bystander.kv_create()
                bystander.pred(other, list(range(200, 200 + 10 * block)))[-1].release()  # 10 pages
                seen = len(kv_events())
                wait_for(lambda: len(kv_events()) > seen, timeout=10, message="a later kv event")
            finally:
                bystander.close()
    finally:
        spy.close()
        worker.end_session(info.session_id)
    got = kv_events()
    assert all(set(e) == {"run_pages", "tenant_device_pages", "tenant_host_pages", "tokens"} for e in got), got
    # A tick may come before the spy's prefill has its pages (a slow host): fewer, never more.
    assert max(e["run_pages"] for e in got) == 2 and max(e["tenant_device_pages"] for e in got) == 2, got
    assert (got[-1]["run_pages"], got[-1]["tenant_device_pages"]) == (2, 2), got  # not the bystander's +10
    events.delete(stream)
