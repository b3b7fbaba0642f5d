"""Run routing by worker heartbeats and KV affinity, and the reaper for runs of dead workers.

Heartbeats are written in the worker's own format (gpu_worker.events) to a private Redis
database, so workers running elsewhere on this machine cannot influence the outcome.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
import redis
from django.utils import timezone

from api.models import KVFile, Program, Run
from api.services import programs, routing
from api.services.runs import create_run, enqueue, reap_orphaned_runs, start_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def heartbeats(worker_heartbeats):
    def beat(name: str, pages_free: int, ok: bool = True, executor_slots: int = 4) -> None:
        info = {"name": name, "ok": ok, "pages_free": pages_free, "pages_total": 100, "sessions": 0}
        worker_heartbeats(info, executor_slots=executor_slots)

    return beat


@pytest.fixture
def program(api_tenant_a):
    prog = Program.objects.create(tenant=api_tenant_a.tenant, name="p")
    programs.add_version(prog, "p.py", b"def main(a):\n    return 1\n")
    return prog


def test_without_heartbeats_or_with_static_routing_runs_go_to_the_configured_worker(heartbeats, api_tenant_a, settings):
    settings.SYMPHONY_WORKER_NAME = "local"
    assert routing.choose_worker(api_tenant_a.tenant) == "local"
    heartbeats("w1", pages_free=10)
    assert routing.choose_worker(api_tenant_a.tenant) == "w1"
    settings.SYMPHONY_ROUTING = "static"
    assert routing.choose_worker(api_tenant_a.tenant) == "local"


def test_the_files_a_run_declares_beat_free_pages_and_unhealthy_workers_are_skipped(heartbeats, api_tenant_a):
    heartbeats("w1", pages_free=10)
    heartbeats("w2", pages_free=90)
    heartbeats("sick", pages_free=100, ok=False)
    KVFile.objects.create(tenant=api_tenant_a.tenant, worker="w1", name="doc", residency="device", pinned=True)
    assert routing.choose_worker(api_tenant_a.tenant, files=["doc"]) == "w1"
    # A run that says nothing of the file is not pulled to it: the tenant's files are not a magnet.
    assert routing.choose_worker(api_tenant_a.tenant) == "w2"
    assert routing.choose_worker(api_tenant_a.tenant, files=["other"]) == "w2"


def test_files_of_a_run_are_its_declared_names_and_its_conversation(api_tenant_a, program):
    run, _ = create_run(api_tenant_a.tenant, program, None, {"conversation": {"name": "resp-1"}}, {"kv_files": ["a"]})
    assert routing.files_of(run) == ["a", "resp-1"]


def test_a_worker_without_a_live_executor_gets_no_runs(heartbeats, api_tenant_a):
    heartbeats("w1", pages_free=10)
    heartbeats("w2", pages_free=90, executor_slots=0)
    assert routing.choose_worker(api_tenant_a.tenant) == "w1"


def test_free_executor_slots_spread_runs_before_free_pages(heartbeats, api_tenant_a, program, settings):
    from api.models import Plan

    Plan.objects.update_or_create(name="pro", defaults={"max_concurrent_runs": 10})
    api_tenant_a.tenant.plan = "pro"
    api_tenant_a.tenant.save()
    heartbeats("w1", pages_free=10)
    heartbeats("w2", pages_free=90)
    placed = []
    for _ in range(6):
        run, _ = create_run(api_tenant_a.tenant, program, None, {}, {})
        placed.append(enqueue(run))
    assert sorted(placed) == ["w1"] * 3 + ["w2"] * 3, placed
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    broker.delete("worker.w1", "worker.w2")


def test_queued_runs_of_a_worker_whose_executor_died_move(heartbeats, api_tenant_a, program, settings):
    from api.services import executor_presence
    from api.services.runs import reroute_stranded

    heartbeats("w1", pages_free=10)
    heartbeats("w2", pages_free=90)
    run, _ = create_run(api_tenant_a.tenant, program, None, {}, {})
    assert enqueue(run) == "w2"
    assert reroute_stranded() == 0  # its executor is alive: it stays
    executor_presence.withdraw(["w2"], "test@w2")  # as its key expires TTL_S after a SIGKILL
    assert reroute_stranded() == 1
    run.refresh_from_db()
    assert (run.status, run.worker) == ("queued", "w1")
    assert reroute_stranded() == 0
    redis.Redis.from_url(settings.CELERY_BROKER_URL).delete("worker.w1", "worker.w2")


def test_created_runs_record_their_target_worker(
    heartbeats, api_tenant_a, program, django_capture_on_commit_callbacks, settings
):
    heartbeats("w2", pages_free=50)
    with django_capture_on_commit_callbacks(execute=True):
        run, _ = create_run(api_tenant_a.tenant, program, None, {}, {})
    run.refresh_from_db()
    assert run.worker == "w2"
    redis.Redis.from_url(settings.CELERY_BROKER_URL).delete("worker.w2")


def test_reaper_fails_runs_of_dead_workers_and_reroutes_their_queue(heartbeats, api_tenant_a, program, settings):
    heartbeats("w1", pages_free=50)
    api_tenant_a.tenant.plan = "pro"  # three runs at once
    api_tenant_a.tenant.save()
    old = timezone.now() - timedelta(minutes=5)
    lost, _ = create_run(api_tenant_a.tenant, program, None, {}, {})
    start_run(str(lost.pk), "ghost")
    Run.objects.filter(pk=lost.pk).update(started_at=old)
    alive, _ = create_run(api_tenant_a.tenant, program, None, {}, {})
    start_run(str(alive.pk), "w1")
    Run.objects.filter(pk=alive.pk).update(started_at=old)
    redis.Redis.from_url(settings.REDIS_URL).set(f"symphony:executor:{alive.pk}", "1", ex=60)
    waiting, _ = create_run(api_tenant_a.tenant, program, None, {}, {})
    Run.objects.filter(pk=waiting.pk).update(worker="ghost", created_at=old)

    assert reap_orphaned_runs() == {"failed": 1, "rerouted": 1}
    lost.refresh_from_db()
    alive.refresh_from_db()
    waiting.refresh_from_db()
    assert lost.status == "failed" and "ghost" in lost.error
    assert alive.status == "running"
    assert (waiting.status, waiting.worker) == ("queued", "w1")
    assert reap_orphaned_runs() == {"failed": 0, "rerouted": 0}
    redis.Redis.from_url(settings.CELERY_BROKER_URL).delete("worker.w1")


def test_reaper_fails_runs_whose_executor_died_and_redelivery_spares_live_ones(heartbeats, api_tenant_a, program):
    """The gpu_worker is alive but the Celery process executing the run is gone (no executor
    heartbeat): the run is failed, once past the grace period. A redelivered task for a run whose
    executor still heartbeats (a run longer than the broker's visibility timeout) leaves it alone."""
    from api.services.execution import execute_run
    from api.services.executor_liveness import ExecutorHeartbeat

    heartbeats("w1", pages_free=50)
    api_tenant_a.tenant.plan = "pro"
    api_tenant_a.tenant.save()
    orphan, _ = create_run(api_tenant_a.tenant, program, None, {}, {})
    start_run(str(orphan.pk), "w1")
    assert reap_orphaned_runs() == {"failed": 0, "rerouted": 0}  # within the grace period
    Run.objects.filter(pk=orphan.pk).update(started_at=timezone.now() - timedelta(minutes=1))
    busy, _ = create_run(api_tenant_a.tenant, program, None, {}, {})
    start_run(str(busy.pk), "w1")
    Run.objects.filter(pk=busy.pk).update(started_at=timezone.now() - timedelta(hours=2))
    with ExecutorHeartbeat(str(busy.pk)):
        assert execute_run(str(busy.pk)) == "skipped"  # the redelivered task
        assert reap_orphaned_runs() == {"failed": 1, "rerouted": 0}
    orphan.refresh_from_db()
    busy.refresh_from_db()
    assert orphan.status == "failed" and "Celery executor" in orphan.error, orphan.error
    assert busy.status == "running"
    assert reap_orphaned_runs() == {"failed": 1, "rerouted": 0}  # its heartbeat ended with the executor
    busy.refresh_from_db()
    assert busy.status == "failed"


def test_reaper_does_nothing_without_evidence(settings, api_tenant_a, program):
    run, _ = create_run(api_tenant_a.tenant, program, None, {}, {})
    start_run(str(run.pk), "ghost")
    Run.objects.filter(pk=run.pk).update(started_at=timezone.now() - timedelta(hours=1))
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # unreachable: liveness unknown
    assert reap_orphaned_runs() == {"failed": 0, "rerouted": 0}


def test_staff_see_worker_health_from_heartbeats(heartbeats, api_tenant_a, admin_client):
    heartbeats("w2", pages_free=5)
    heartbeats("w1", pages_free=50)
    workers = admin_client.get("/api/v1/admin/workers").json()
    assert [(w["name"], w["pages_free"]) for w in workers] == [("w1", 50), ("w2", 5)]
    assert api_tenant_a.session_client().get("/api/v1/admin/workers").status_code == 403


def test_a_drained_worker_gets_no_runs_and_its_queue_moves(heartbeats, api_tenant_a, program, settings):
    from api.services import worker_fleet

    heartbeats("w1", pages_free=10)
    heartbeats("w2", pages_free=90)
    run, _ = create_run(api_tenant_a.tenant, program, None, {}, {})
    assert enqueue(run) == "w2"
    state = worker_fleet.drain("w2")
    assert (state.draining, state.queued, state.idle) == (True, 0, True)
    run.refresh_from_db()
    assert run.worker == "w1"
    assert routing.choose_worker(api_tenant_a.tenant) == "w1"
    with pytest.raises(worker_fleet.FleetError, match="still up"):
        worker_fleet.remove("w2")
    assert not worker_fleet.undrain("w2").draining
    assert routing.choose_worker(api_tenant_a.tenant) == "w2"
    redis.Redis.from_url(settings.CELERY_BROKER_URL).delete("worker.w1", "worker.w2")
