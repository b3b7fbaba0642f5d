"""Which built-in runs take the in-process path (api/services/trusted_runs.py) and which go to
Celery, on the real database and Redis broker. The path itself, end to end (run, usage,
billing, events, cancellation): tests/integration/test_trusted_builtin.py."""

from __future__ import annotations

import pytest
from django.db import transaction

from api.models import Run
from api.services import openai_requests, programs, trusted_runs
from api.services.runs import create_run

pytestmark = pytest.mark.django_db

ARGS = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


@pytest.fixture
def local_worker(settings, tmp_path, monkeypatch):
    """A local admin socket path that exists (nothing listens: no run may reach it here), one
    in-process thread, and static routing to the local worker."""
    sock = tmp_path / "admin.sock"
    sock.touch()
    settings.SYMPHONY_WORKER_ADMIN_SOCKET = str(sock)
    settings.SYMPHONY_TRUSTED_BUILTIN = True
    settings.SYMPHONY_TRUSTED_THREADS = 1
    settings.SYMPHONY_ROUTING = "static"
    monkeypatch.setattr(trusted_runs, "_pool", None)
    monkeypatch.setattr(trusted_runs, "_slots", None)
    return settings.SYMPHONY_WORKER_NAME


def _create(tenant, program, capture) -> Run:
    with capture(execute=True):
        run, _ = create_run(tenant, program, None, ARGS, {"max_tokens": 64}, send=trusted_runs.submit)
    return Run.objects.get(pk=run.pk)


def test_available_only_when_on_and_the_local_worker_is_reachable(settings, tmp_path):
    settings.SYMPHONY_TRUSTED_BUILTIN = True
    settings.SYMPHONY_WORKER_ADMIN_SOCKET = str(tmp_path / "absent.sock")
    assert not trusted_runs.available()
    (tmp_path / "absent.sock").touch()
    assert trusted_runs.available()
    settings.SYMPHONY_TRUSTED_BUILTIN = False
    assert not trusted_runs.available()


def test_with_every_thread_busy_a_builtin_run_takes_the_celery_path(
    api_tenant_a, local_worker, django_capture_on_commit_callbacks
):
    program = openai_requests.builtin_program(api_tenant_a.tenant)
    assert trusted_runs.is_builtin(program.versions.order_by("-number").first())
    _, slots = trusted_runs._executor()
    assert slots.acquire(blocking=False)  # the one thread is taken
    try:
        run = _create(api_tenant_a.tenant, program, django_capture_on_commit_callbacks)
    finally:
        slots.release()
    # Enqueued for the local worker's Celery executor (``_enqueue`` names it), not held in memory.
    assert run.status == "queued" and run.worker == local_worker


def test_a_tenants_own_version_of_openai_compat_never_runs_in_process(
    api_tenant_a, local_worker, django_capture_on_commit_callbacks
):
    program = openai_requests.builtin_program(api_tenant_a.tenant)
    mine = programs.add_version(program, "openai_lip.py", b"def main(args):\n    return 'mine'\n")
    assert not trusted_runs.is_builtin(mine)
    run = _create(api_tenant_a.tenant, program, django_capture_on_commit_callbacks)
    assert run.program_version_id == mine.pk
    assert run.status == "queued" and run.worker == local_worker  # sent to Celery and the sandbox


REQUEST = openai_requests.CompletionRequest(chat=True, args=ARGS, stream=False, model="m", run_max_tokens=64)


@pytest.fixture
def handed(monkeypatch) -> list[str]:
    """The ids of the runs handed to an in-process thread, which here only gives its thread back
    (nothing listens on the local worker's socket)."""
    runs: list[str] = []

    def hand_over(run_id, execute):
        runs.append(run_id)
        trusted_runs.release_thread()

    monkeypatch.setattr(trusted_runs, "_hand_over", hand_over)
    return runs


@pytest.mark.django_db(transaction=True)
def test_with_a_thread_free_a_builtin_run_is_created_running_on_it(api_tenant_a, local_worker, handed):
    """Created running on the thread taken for it: no second transaction to start it."""
    run = openai_requests.start(api_tenant_a.tenant, None, REQUEST)
    assert handed == [str(run.pk)]
    row = Run.objects.get(pk=run.pk)
    assert row.status == "running" and row.worker == local_worker and row.started_at is not None
    _, slots = trusted_runs._executor()
    assert slots.acquire(blocking=False), "the thread was given back"
    slots.release()


@pytest.mark.django_db(transaction=True)
def test_a_run_created_inside_an_outer_transaction_is_started_after_its_commit(api_tenant_a, local_worker, handed):
    """A stored Responses turn creates its row in the run's transaction: a run created running
    there would keep its thread taken if that transaction rolled back, so it is created queued
    and taken by ``submit`` once committed."""
    with transaction.atomic():
        run = openai_requests.start(api_tenant_a.tenant, None, REQUEST)
        assert Run.objects.get(pk=run.pk).status == "queued" and handed == []
    assert handed == [str(run.pk)]  # taken by ``submit`` once committed
    with pytest.raises(RuntimeError), transaction.atomic():
        openai_requests.start(api_tenant_a.tenant, None, REQUEST)
        raise RuntimeError("the turn's row failed")
    _, slots = trusted_runs._executor()
    assert slots.acquire(blocking=False), "no thread is left taken by the run rolled back"
    slots.release()
