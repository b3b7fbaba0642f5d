"""Runs that only wait must not take every executor slot from the other accounts.

Two tenants of ONE person (one account) start more runs that only ``sleep`` than the executor
has slots (2 here, ``stack_concurrency``; ``make up`` has 4). A run of another account submitted
after them must start within ``MAX_START_S`` of being queued, not when a sleeper ends (it waited
a whole sleep before, 41 s in the report that found it), and finish; every sleeper still
finishes exactly once, the account never held more than its ceiling of slots at once, and no
slot lease is left in Redis afterwards (api/services/executor_slots.py).
"""

from __future__ import annotations

import time

import pytest
import redis
from django.conf import settings

from tests.conftest import wait_for
from tests.plugins.api import ApiTenant
from tests.plugins.worker import RunningWorker

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.integration,
    pytest.mark.docker,
    pytest.mark.vllm,
    pytest.mark.timeout(300),
]

SLOTS = 2
SLEEP_S = 6.0
#: Queued -> running for the other account's run: a slot is free for it at once (one of the two
#: is never the sleepers'); the margin is this shared 2-core machine's scheduling.
MAX_START_S = 3.0
#: The slot leases of every executor (api/services/executor_slots.py).
LEASES = "symphony:executor-slots:*"

SLEEPER_LIP = b"""
from symphony import send_to_user, sleep


def main(args):
    send_to_user("started")
    sleep(args["seconds"])
    return {"slept": args["seconds"]}
"""

QUICK_LIP = b"""
def main(args):
    return {"ok": True}
"""


@pytest.fixture(scope="module")
def stack_worker(shared_stack_worker: RunningWorker) -> RunningWorker:
    return shared_stack_worker


@pytest.fixture
def stack_concurrency() -> int:
    return SLOTS


def _second_tenant_of(owner: ApiTenant, slug: str) -> ApiTenant:
    """Another tenant created by ``owner``'s person: the same account."""
    from api.models import Membership, Tenant
    from api.services.keys import issue_key
    from api.tenancy import KEY_SCOPES

    owner.tenant.account = owner.user
    owner.tenant.save(update_fields=["account"])
    tenant = Tenant.objects.create(name=slug.title(), slug=slug, account=owner.user)
    Membership.objects.create(user=owner.user, tenant=tenant, role="owner")
    return ApiTenant(tenant, owner.user, issue_key(tenant, "test", list(KEY_SCOPES), owner.user).secret)


def _started_events(run_id: str) -> int:
    events = redis.Redis.from_url(settings.REDIS_URL)
    return sum(b'"started"' in f.get(b"data", b"") for _, f in events.xrange(f"run:{run_id}"))


def _most_at_once(intervals: list[tuple[float, float]]) -> int:
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def test_sleepers_of_one_account_leave_a_slot_for_another(
    stack, stack_worker: RunningWorker, api_tenant_a, api_tenant_b, tmp_path
):
    from api.models import Plan, Run
    from gpu_worker.resource_model import Pool, PoolName
    from symphony_client import Client

    first, second = api_tenant_a, _second_tenant_of(api_tenant_a, "alpha-two")
    assert first.tenant.account_key == second.tenant.account_key != api_tenant_b.tenant.account_key
    # Concurrent runs are bounded per account too (the best of its tenants' plans): a plan of 4
    # lets the account queue more sleepers than the executor has slots.
    Plan.objects.update_or_create(name="sleepers", defaults={"max_concurrent_runs": 4})
    for owner in (first, second):
        owner.tenant.plan = "sleepers"
        owner.tenant.save(update_fields=["plan"])
    (tmp_path / "sleeper.py").write_bytes(SLEEPER_LIP)
    (tmp_path / "quick.py").write_bytes(QUICK_LIP)

    sleepers = []
    for owner in (first, second):
        client = Client(stack, owner.key_secret, timeout=60)
        program = client.upload_program(tmp_path / "sleeper.py", name="sleeper")
        for _ in range(2):
            run = client.create_run(program["id"], args={"seconds": SLEEP_S}, limits={"deadline_s": 120})
            sleepers.append(run["id"])
    assert len(sleepers) > SLOTS
    wait_for(
        lambda: Run.objects.filter(pk__in=sleepers, status="running").exists(),
        timeout=60,
        message="a sleeper to start",
    )
    time.sleep(1.5)  # every sleeper's task has reached the executor by now

    other = Client(stack, api_tenant_b.key_secret, timeout=60)
    quick = other.create_run(other.upload_program(tmp_path / "quick.py", name="quick")["id"], args={})["id"]
    assert other.wait(quick, timeout=60)["status"] == "succeeded"
    run = Run.objects.get(pk=quick)
    waited = (run.started_at - run.created_at).total_seconds()
    print(f"other account's run: queued -> running in {waited:.2f} s")
    assert waited < MAX_START_S, f"the other account's run waited {waited:.1f} s for a slot"

    wait_for(
        lambda: not Run.objects.filter(pk__in=sleepers).exclude(status__in=Run.TERMINAL).exists(),
        timeout=len(sleepers) * SLEEP_S + 90,
        interval=0.5,
        message="every sleeper to finish",
    )
    done = list(Run.objects.filter(pk__in=sleepers))
    assert [r.status for r in done] == ["succeeded"] * len(sleepers), [(r.status, r.error) for r in done]
    assert all(_started_events(str(r.pk)) == 1 for r in done), "a sleeper ran twice or not at all"
    held = _most_at_once([(r.started_at.timestamp(), r.finished_at.timestamp()) for r in done])
    assert held <= Pool(PoolName.EXECUTOR_SLOTS, SLOTS).ceiling, f"one account held {held} of {SLOTS} slots"

    leases = redis.Redis.from_url(settings.REDIS_URL)
    wait_for(
        lambda: not list(leases.scan_iter(match=LEASES)),
        timeout=5,
        message="the slot leases to be removed",
    )
