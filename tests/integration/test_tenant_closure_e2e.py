"""Closing a tenant through the whole real stack: its LIPs wrote named KV files on a real worker
(persisted to its KV store) and one of its runs is decoding in a gVisor sandbox when the owner
closes it from a signed-in browser session over HTTP. At once its key stops working and the
running program stops; then Celery deletes its KV files on the worker's host (its queue
``worker.<name>``) and its programs and runs on the housekeeping queue. Another tenant with a file
of the same name loses nothing."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import pytest

from tests.conftest import celery_worker, wait_for
from tests.plugins.api import ApiTenant, _make_tenant

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.integration,
    pytest.mark.docker,
    pytest.mark.vllm,
]

#: The API's default Celery queue in this module (purge_tenant goes there), so no other Celery
#: worker on this machine takes the task.
HOUSEKEEPING_QUEUE = f"housekeeping-{uuid.uuid4().hex[:8]}"

NOTES_LIP = b"""
from symphony import kv_create, pred


def main(args):
    doc = kv_create(args["name"])  # a named file outlives the run
    pred(doc, list(range(100, 100 + args["tokens"])))
    doc.close()
    return {"written": args["tokens"]}
"""

ENDLESS_LIP = b"""
from symphony import kv_create, kv_truncate, pred, send_to_user


def main(args):
    kv = kv_create()
    dist = pred(kv, [1, 2, 3])[-1]
    step = 0
    while True:
        dist = pred(kv, [dist.argmax()])[-1]
        step += 1
        send_to_user(f"step {step} ")
        if step % 32 == 0:
            kv_truncate(kv, 3)
"""


@pytest.fixture(scope="module")
def stack_worker(gpu_worker_process):
    return gpu_worker_process


@pytest.fixture
def stack_env() -> dict[str, str]:
    return {"CELERY_DEFAULT_QUEUE": HOUSEKEEPING_QUEUE}


def _write_notes(stack, owner: ApiTenant, lip: Path) -> None:
    from symphony_client import Client

    client = Client(stack, owner.key_secret, timeout=60)
    program = client.upload_program(lip, name="notes")
    run = client.create_run(program["id"], args={"name": "notes", "tokens": 40})
    wait_for(lambda: client.get_run(run["id"])["status"] not in ("queued", "running"), timeout=120, message="notes run")
    assert client.get_run(run["id"])["status"] == "succeeded", client.run_logs(run["id"])


def _console_session(stack, email: str) -> httpx.Client:
    """A signed-in console session over HTTP, with Django's CSRF token as the console sends it."""
    http = httpx.Client(base_url=stack, timeout=30)
    token = http.get("/api/v1/auth/csrf").json()["csrftoken"]
    http.headers["X-CSRFToken"] = token
    response = http.post("/api/v1/auth/login", json={"email": email, "password": "pw-12345678"})
    assert response.status_code == 200, response.text
    http.headers["X-CSRFToken"] = http.cookies["csrftoken"]  # rotated at login
    return http


#: What one named file leaves in a directory store: its blob, its lease and the lease's lock
#: file (gpu_worker/kvfs/lease.py, gpu_worker/kvfs/store.py).
STORED_NOTES = [".lock-notes.lease", "notes.lease", "notes.safetensors"]


def _stored(worker, slug: str) -> list[str]:
    """Every file of the tenant's folder in the store, hidden ones included."""
    folder = Path(worker.kv_store) / slug
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_closing_a_tenant_stops_it_and_deletes_its_data_on_the_worker(stack, stack_worker, tmp_path):
    from api.models import AuditLog, KVFile, Program, Run, Tenant, UsageRecord
    from symphony_client import ApiError, Client

    suffix = uuid.uuid4().hex[:6]
    closing, staying = _make_tenant(f"closing-{suffix}"), _make_tenant(f"staying-{suffix}")
    notes = tmp_path / "notes.py"
    notes.write_bytes(NOTES_LIP)
    for owner in (closing, staying):
        _write_notes(stack, owner, notes)
    for owner in (closing, staying):
        assert [f["name"] for f in stack_worker.admin.kv_list(owner.tenant.slug)] == ["notes"]
        assert _stored(stack_worker, owner.tenant.slug) == STORED_NOTES

    client = Client(stack, closing.key_secret, timeout=60)
    endless = tmp_path / "endless.py"
    endless.write_bytes(ENDLESS_LIP)
    running = client.create_run(client.upload_program(endless, name="endless")["id"], limits={"deadline_s": 120})
    for event in client.events(running["id"]):
        if event.type == "token":
            break  # decoding in its sandbox

    console = _console_session(stack, closing.user.email)
    path = f"/api/v1/tenants/{closing.tenant.pk}/close"
    refused = console.post(path, json={"confirm": "not-the-slug"})
    assert refused.status_code == 400 and client.me()["tenants"]  # nothing changed
    closed = console.post(path, json={"confirm": closing.tenant.slug})
    assert closed.status_code == 200, closed.text
    assert closed.json()["tenants"] == []
    console.close()

    with pytest.raises(ApiError) as refused_key:
        client.list_programs()
    assert refused_key.value.status == 401
    # The decoding program is stopped, and what it used is recorded (then billed).
    wait_for(lambda: UsageRecord.objects.filter(run_id=running["id"]).exists(), timeout=60, message="its usage")
    assert Run.objects.get(pk=running["id"]).status == "cancelled"

    with celery_worker(HOUSEKEEPING_QUEUE, stack.env):
        tenant = closing.tenant
        wait_for(lambda: Tenant.objects.get(pk=tenant.pk).purged_at is not None, timeout=120, message="the purge")
        wait_for(lambda: not stack_worker.admin.kv_list(tenant.slug), timeout=60, message="KV files deleted")
    assert _stored(stack_worker, tenant.slug) == []
    assert not KVFile.objects.filter(tenant=tenant).exists()
    assert not Program.objects.filter(tenant=tenant).exists() and not Run.objects.filter(tenant=tenant).exists()
    assert UsageRecord.objects.filter(tenant=tenant).count() == 2  # the notes run and the cancelled one
    assert AuditLog.objects.filter(tenant=tenant, action="tenant.close").exists()

    # The other tenant's file of the same name, its programs and its key are untouched.
    assert [f["name"] for f in stack_worker.admin.kv_list(staying.tenant.slug)] == ["notes"]
    assert _stored(stack_worker, staying.tenant.slug) == STORED_NOTES
    other = Client(stack, staying.key_secret, timeout=60)
    assert [p["name"] for p in other.list_programs()] == ["notes"]
