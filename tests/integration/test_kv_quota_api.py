"""A tenant's KV file bounds across the control plane and a real worker: the plan's file count
reaches the worker with each run's session limits (a LIP creating one more named file gets a
clear EDQUOT), listing the bounded files is paginated and quick, and a pin through the REST API
past the plan's share of the device pool is a 429 ``quota_exceeded`` while another tenant's
requests go on."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from api.models import Plan, Program
from api.services import programs
from api.services.quotas import session_limits
from api.services.runs import create_run
from gpu_worker.protocol import ErrorCode

pytestmark = [pytest.mark.django_db, pytest.mark.integration, pytest.mark.vllm, pytest.mark.timeout(300)]

#: Files the test plan allows: enough that one mirror refresh per file (17 s for 5,000 files
#: before) shows in the listing's time.
MAX_FILES = 2000
LISTING_BOUND_S = 3.0


@pytest.fixture
def worker(gpu_worker_process, settings, api_tenant_a) -> Iterator:
    """The shared worker, left without the tenant's files afterwards."""
    settings.SYMPHONY_WORKER_ADMIN_SOCKET = gpu_worker_process.admin_socket
    try:
        yield gpu_worker_process
    finally:
        gpu_worker_process.admin.kv_delete_tenant(api_tenant_a.tenant.slug)


def _run_session(worker, tenant):
    """A worker session with the limits the executor gives a run of ``tenant`` (its plan's)."""
    program = Program.objects.create(tenant=tenant, name="p")
    programs.add_version(program, "p.py", b"def main(a):\n    return 1\n")
    run, _ = create_run(tenant, program, None, {}, {})
    return worker.create_session(tenant.slug, str(run.pk), **session_limits(run))


def test_named_files_past_the_plan_are_edquot_and_the_listing_is_paginated(worker, api_tenant_a, api_tenant_b):
    import symphony as sy

    Plan.objects.filter(name="free").update(max_kv_files=MAX_FILES)
    info = _run_session(worker, api_tenant_a.tenant)
    lip = sy.connect(info.socket_path, info.token)
    try:
        for i in range(MAX_FILES):
            lip.kv_create(f"f{i:04d}").close()
        with pytest.raises(sy.QuotaExceeded) as refused:
            lip.kv_create("one-more")
    finally:
        lip.close()
        worker.end_session(info.session_id)
    assert refused.value.code == ErrorCode.QUOTA
    assert f"{MAX_FILES} named KV files (its plan allows {MAX_FILES})" in refused.value.message

    client = api_tenant_a.key_client()
    started = time.monotonic()
    first = client.get("/api/v1/kv-files")
    took = time.monotonic() - started
    assert first.status_code == 200 and "X-Symphony-Stale" not in first
    body = first.json()
    assert body["count"] == MAX_FILES and len(body["results"]) == 50 and body["next"]
    assert took < LISTING_BOUND_S, f"listing {MAX_FILES} files took {took:.1f}s"
    huge = client.get("/api/v1/kv-files", {"limit": 10**9}).json()
    assert len(huge["results"]) == 500
    last = client.get("/api/v1/kv-files", {"limit": 500, "offset": MAX_FILES - 10}).json()
    assert [f["name"] for f in last["results"]] == [f"f{i:04d}" for i in range(MAX_FILES - 10, MAX_FILES)]
    assert last["next"] is None

    started = time.monotonic()
    other = api_tenant_b.key_client().get("/api/v1/kv-files")
    assert other.status_code == 200 and other.json()["count"] == 0
    assert time.monotonic() - started < LISTING_BOUND_S


def test_a_pin_past_the_device_share_through_the_api_is_429(worker, api_tenant_a, api_tenant_b):
    import symphony as sy

    health = worker.admin.health()
    share = int(Plan.objects.get(name="free").kv_pinned_device_share * health["pages_total"])
    info = _run_session(worker, api_tenant_a.tenant)
    lip = sy.connect(info.socket_path, info.token)
    try:
        for name, pages in (("small", 1), ("big", share + 1)):
            kv = lip.kv_create(name)
            lip.pred(kv, list(range(100, 100 + pages * health["block_size"])))[-1].release()
            kv.close()
    finally:
        lip.close()
        worker.end_session(info.session_id)

    client = api_tenant_a.key_client()
    files = {f["name"]: f["id"] for f in client.get("/api/v1/kv-files").json()["results"]}
    refused = client.post(f"/api/v1/kv-files/{files['big']}/pin", {"pinned": True}, format="json")
    assert refused.status_code == 429, refused.content
    error = refused.json()["error"]
    assert error["code"] == "quota_exceeded" and "share of the device pool" in error["message"]
    pinned = {f["name"]: f["pinned"] for f in worker.admin.kv_list(api_tenant_a.tenant.slug)}
    assert pinned == {"big": False, "small": False}
    assert client.post(f"/api/v1/kv-files/{files['small']}/pin", {"pinned": True}, format="json").status_code == 200
    assert api_tenant_b.key_client().get("/api/v1/kv-files").status_code == 200
