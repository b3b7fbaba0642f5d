"""Admission of runs to an executor's slots (api/services/executor_slots.py) on the real
PostgreSQL and Redis: one account holds at most its bound of one executor's slots, another
account is admitted meanwhile, a lease ends with its run or expires with a dead executor, and a
one-slot executor admits every run. The end-to-end check through Celery and the sandbox is
``reliability/test_executor_share.py``."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
import redis
from django.conf import settings
from django.contrib.auth import get_user_model

from api.models import Program, Run, Tenant
from api.services import executor_slots, programs

pytestmark = [pytest.mark.django_db(transaction=True)]

WORKER = "slots-worker"


@pytest.fixture
def node(monkeypatch) -> Iterator[str]:
    """A private executor node name; its leases are removed afterwards."""
    monkeypatch.setattr(executor_slots, "_executor", None)
    name = f"test-node-{uuid.uuid4().hex[:8]}"
    yield name
    redis.Redis.from_url(settings.REDIS_URL).delete(executor_slots.lease_key(name))


def _tenant(slug: str, account=None) -> Tenant:
    return Tenant.objects.create(name=slug, slug=slug, account=account)


def _queued(tenant: Tenant) -> str:
    program = Program.objects.create(tenant=tenant, name=f"p-{uuid.uuid4().hex[:6]}")
    version = programs.add_version(program, "p.py", b"def main(a):\n    return 1\n")
    return str(Run.objects.create(tenant=tenant, program_version=version, worker=WORKER).pk)


def _person() -> object:
    name = f"{uuid.uuid4().hex[:8]}@example.com"
    return get_user_model().objects.create_user(username=name, email=name, password="pw-12345678")


def _leases(node: str) -> int:
    return redis.Redis.from_url(settings.REDIS_URL).zcard(executor_slots.lease_key(node))


def test_one_account_holds_its_ceiling_and_another_account_is_admitted(node):
    executor_slots.record_capacity(node, 2, "celery.concurrency.thread")
    person = _person()
    first, second, other = _tenant("a-one", person), _tenant("a-two", person), _tenant("b-one")
    holding = executor_slots.admit(_queued(first), WORKER)
    assert holding.admitted and holding.lease is not None
    with holding.lease:
        refused = executor_slots.admit(_queued(second), WORKER)  # the same person's other tenant
        assert (refused.admitted, refused.held, refused.bound) == (False, 1, 1)
        admitted = executor_slots.admit(_queued(other), WORKER)
        assert admitted.admitted and admitted.lease is not None
        with admitted.lease:
            assert _leases(node) == 2
    assert _leases(node) == 0
    assert executor_slots.admit(_queued(second), WORKER).admitted  # its own run ended


def test_an_account_gets_its_fair_share_while_another_waits(node):
    executor_slots.record_capacity(node, 4, "celery.concurrency.prefork")
    person = _person()
    first, second = _tenant("c-one", person), _tenant("c-two", person)
    leases = [executor_slots.admit(_queued(t), WORKER) for t in (first, first)]
    assert all(a.admitted for a in leases)
    waiting = _queued(second)  # the account's own queued run does not lower its bound
    third = executor_slots.admit(waiting, WORKER)
    assert third.admitted and third.bound == 3
    Run.objects.filter(pk=waiting).update(status="running")
    assert not executor_slots.admit(_queued(second), WORKER).admitted  # the ceiling: 3 of 4
    _queued(_tenant("d-one"))  # another account queues a run for this worker
    assert executor_slots.bound_for(first.account_key, WORKER, 4) == 2
    assert executor_slots.bound_for(_tenant("e-one").account_key, WORKER, 4) == 1  # three active


def test_a_dead_executors_lease_expires(node, monkeypatch):
    monkeypatch.setattr(executor_slots, "LEASE_TTL_S", 1)
    executor_slots.record_capacity(node, 2, "celery.concurrency.thread")
    person = _person()
    orphan = executor_slots.admit(_queued(_tenant("f-one", person)), WORKER)
    assert orphan.admitted  # its executor "dies": the lease is never refreshed nor removed
    later = _queued(_tenant("f-two", person))
    assert not executor_slots.admit(later, WORKER).admitted
    time.sleep(1.2)
    assert executor_slots.admit(later, WORKER).admitted


def test_a_one_slot_executor_admits_every_run(node):
    executor_slots.record_capacity(node, 8, "celery.concurrency.solo")  # solo: one slot
    tenant = _tenant("g-one")
    admissions = [executor_slots.admit(_queued(tenant), WORKER) for _ in range(3)]
    assert all(a.admitted and a.lease is None for a in admissions)
    assert _leases(node) == 0


def test_the_heartbeat_refreshes_the_slot_lease_in_its_one_thread(node, monkeypatch):
    """A running run has one thread refreshing Redis: the executor heartbeat carries its slot
    lease, and the lease outlives its TTL only because the heartbeat refreshes it."""
    import threading

    from api.services import executor_liveness

    monkeypatch.setattr(executor_liveness, "PERIOD_S", 0.2)
    monkeypatch.setattr(executor_slots, "LEASE_TTL_S", 1)
    executor_slots.record_capacity(node, 2, "celery.concurrency.thread")
    run_id = _queued(_tenant("h-one"))
    admission = executor_slots.admit(run_id, WORKER)
    assert admission.admitted and admission.lease is not None
    before = set(threading.enumerate())
    with admission.lease, executor_liveness.ExecutorHeartbeat(run_id, (admission.lease,)):
        started = [t for t in threading.enumerate() if t not in before]
        time.sleep(1.6)  # past the lease's TTL: only the heartbeat's refreshes keep it
        assert _leases(node) == 1
        assert executor_liveness.executor_alive(run_id)
    assert [t.name for t in started] == [f"executor-heartbeat-{run_id}"]
    assert _leases(node) == 0 and not executor_liveness.executor_alive(run_id)
