"""Failover decided by the executor: a run whose worker refuses the admin socket before the
session exists is re-routed (bounded), the dead worker leaves routing at once, and the runs
queued on it move with it. The executor runs in-process against a socket path nobody listens
on; heartbeats are written in the worker's own format to a private Redis database."""

from __future__ import annotations

import json

import pytest
import redis

from api.models import Program, Run, UsageRecord
from api.services import failover, programs, routing
from api.services.execution import execute_run
from api.services.runs import create_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def two_workers(worker_heartbeats, settings, tmp_path):
    """``dead`` (this executor's worker, its socket absent) and ``live``, both heartbeating."""
    for name in ("dead", "live"):
        worker_heartbeats({"name": name, "ok": True, "pages_free": 50, "pages_total": 100, "sessions": 0})
    settings.SYMPHONY_WORKER_NAME = "dead"
    settings.SYMPHONY_WORKER_ADMIN_SOCKET = str(tmp_path / "absent.sock")
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    broker.delete("worker.live", "worker.dead")
    yield broker
    broker.delete("worker.live", "worker.dead")


@pytest.fixture
def program(api_tenant_a):
    api_tenant_a.tenant.plan = "pro"  # three runs at once
    api_tenant_a.tenant.save()
    prog = Program.objects.create(tenant=api_tenant_a.tenant, name="p")
    programs.add_version(prog, "p.py", b"def main(a):\n    return 1\n")
    return prog


def _queued_on(tenant, program, worker: str) -> Run:
    run, _ = create_run(tenant, program, None, {}, {})
    Run.objects.filter(pk=run.pk).update(worker=worker)
    return run


def _tasks(broker, queue: str) -> list[dict]:
    return [json.loads(m) for m in broker.lrange(queue, 0, -1)]


def test_refused_admin_socket_reroutes_the_run_and_the_queue_behind_it(two_workers, api_tenant_a, program):
    broker = two_workers
    first = _queued_on(api_tenant_a.tenant, program, "dead")
    behind = _queued_on(api_tenant_a.tenant, program, "dead")

    assert execute_run(str(first.pk), target="dead") == "rerouted"

    first.refresh_from_db()
    behind.refresh_from_db()
    assert (first.status, first.worker, first.started_at) == ("queued", "live", None)
    assert (behind.status, behind.worker) == ("queued", "live")
    assert [w.name for w in routing.live_workers()] == ["live"]  # out of routing before its heartbeat expired
    assert routing.choose_worker(api_tenant_a.tenant) == "live"
    sent = _tasks(broker, "worker.live")
    assert len(sent) == 2
    assert not UsageRecord.objects.filter(run=first).exists()  # nothing ran, nothing billed
    # The task of ``behind`` still waiting in the dead worker's queue is dropped, not started.
    assert execute_run(str(behind.pk), target="dead") == "skipped"
    behind.refresh_from_db()
    assert (behind.status, behind.worker) == ("queued", "live")


def test_reroutes_are_bounded_then_the_run_fails_naming_the_worker(two_workers, api_tenant_a, program, settings):
    run = _queued_on(api_tenant_a.tenant, program, "dead")
    assert execute_run(str(run.pk), target="dead", attempt=failover.MAX_REROUTES) == "failed"
    run.refresh_from_db()
    assert run.status == "failed"
    assert "no gpu_worker could take the run" in run.error and "'dead'" in run.error, run.error
    assert "re-routed 3 times" in run.error
    assert UsageRecord.objects.filter(run=run).exists()  # finished like any run: one usage row


def test_a_cancelled_run_is_not_rerouted_but_gets_its_usage_row(two_workers, api_tenant_a, program):
    from api.services.runs import cancel_run, return_to_queue, start_run

    run = _queued_on(api_tenant_a.tenant, program, "dead")
    start_run(str(run.pk), "dead")
    cancel_run(run)
    assert return_to_queue(str(run.pk), "dead") is None
    refused = ConnectionRefusedError(111, "Connection refused")
    assert failover.reroute_unstarted(str(run.pk), "dead", refused, 0) == "skipped"
    run.refresh_from_db()
    assert run.status == "cancelled"
    assert UsageRecord.objects.filter(run=run).count() == 1  # a purge waiting on it goes ahead
    assert not _tasks(two_workers, "worker.live")


def test_a_marked_worker_stays_out_until_the_marker_expires(two_workers, worker_heartbeats, settings):
    def beat_live() -> None:
        worker_heartbeats({"name": "live", "ok": True, "pages_free": 50, "pages_total": 100, "sessions": 0})

    assert routing.mark_unavailable("live", "test")
    beat_live()  # a heartbeat written just before the death must not route runs back to it
    assert [w.name for w in routing.live_workers()] == ["dead"]
    redis.Redis.from_url(settings.REDIS_URL).delete(routing.UNAVAILABLE_PREFIX + "live")  # expired
    beat_live()
    assert sorted(w.name for w in routing.live_workers()) == ["dead", "live"]
