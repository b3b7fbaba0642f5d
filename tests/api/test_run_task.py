"""The ``run_lip`` Celery task through a real ``celery worker`` subprocess and Postgres: a run whose
worker socket is unreachable is re-routed a bounded number of times (here always back to the same
dead worker, the only one) and then ends ``failed`` with a clear error and a usage row; a
redelivered task for a run left ``running`` fails it instead of starting it twice."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from django.conf import settings

from api.models import Program, Run, UsageRecord
from api.services import programs
from api.services.failover import MAX_REROUTES
from api.services.runs import create_run, start_run
from api.tasks import run_lip
from tests.conftest import celery_worker, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration]


@pytest.fixture
def api_celery_queue(monkeypatch, tmp_path) -> Iterator[str]:
    """A real Celery worker on the test database whose gpu_worker admin socket does not exist,
    consuming its worker's queue ``worker.<name>`` (where re-routed runs come back to)."""
    db = settings.DATABASES["default"]
    name = f"gone-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("DATABASE_URL", f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}")
    monkeypatch.setenv("SYMPHONY_WORKER_ADMIN_SOCKET", str(tmp_path / "absent.sock"))
    monkeypatch.setenv("SYMPHONY_WORKER_NAME", name)
    monkeypatch.setenv("SYMPHONY_ROUTING", "static")  # live workers elsewhere on this machine stay out
    with celery_worker(f"worker.{name}"):
        yield f"worker.{name}"


@pytest.fixture
def queued_run(api_tenant_a) -> Run:
    prog = Program.objects.create(tenant=api_tenant_a.tenant, name="p")
    programs.add_version(prog, "p.py", b"def main(a):\n    return 1\n")
    return create_run(api_tenant_a.tenant, prog, None, {}, {"max_tokens": 16})[0]


def _status(run: Run) -> str:
    run.refresh_from_db()
    return run.status


def test_unreachable_worker_fails_run_with_usage(api_celery_queue, queued_run):
    run_lip.apply_async(args=[str(queued_run.pk)], queue=api_celery_queue)
    wait_for(lambda: _status(queued_run) == "failed", timeout=60, message="run to fail")
    assert "no gpu_worker could take the run" in queued_run.error, queued_run.error
    assert f"re-routed {MAX_REROUTES} times" in queued_run.error
    assert queued_run.finished_at is not None
    assert UsageRecord.objects.filter(run=queued_run).count() == 1


def test_redelivered_task_of_running_run_fails_it(api_celery_queue, queued_run):
    start_run(str(queued_run.pk), "local")
    run_lip.apply_async(args=[str(queued_run.pk)], queue=api_celery_queue)
    wait_for(lambda: _status(queued_run) == "failed", timeout=60, message="run to fail")
    assert "died" in queued_run.error
