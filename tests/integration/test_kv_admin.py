"""KV files across the control plane and a real worker: a LIP's named file shows up in the
tenant's list, staff eviction moves it to disk on the worker, updates the mirror and is audited;
the owner's delete removes it on the worker. Another tenant sees none of it."""

from __future__ import annotations

import pytest

from api.models import AuditLog, KVFile

pytestmark = [pytest.mark.django_db, pytest.mark.integration, pytest.mark.vllm]


def test_named_file_listed_evicted_by_staff_and_deleted(
    gpu_worker_process, settings, api_tenant_a, api_tenant_b, admin_client, admin_user
):
    import symphony

    settings.SYMPHONY_WORKER_ADMIN_SOCKET = gpu_worker_process.admin_socket
    slug = api_tenant_a.tenant.slug
    with gpu_worker_process.session(slug) as info:
        sdk = symphony.connect(info.socket_path, info.token)
        doc = sdk.kv_create("handbook")
        sdk.pred(doc, list(range(100, 400)))[-1].release()
        doc.close()
        sdk.close()

    owner = api_tenant_a.key_client()
    listed = owner.get("/api/v1/kv-files").json()["results"]
    assert [(f["name"], f["tokens"], f["residency"]) for f in listed] == [("handbook", 300, "device")]
    assert api_tenant_b.key_client().get("/api/v1/kv-files").json()["results"] == []
    kv_id = listed[0]["id"]
    assert api_tenant_b.key_client().delete(f"/api/v1/kv-files/{kv_id}").status_code == 404

    assert admin_client.post(f"/api/v1/admin/kv-files/{kv_id}/evict").json() == {"evicted": True}
    assert KVFile.objects.get(pk=kv_id).residency == "disk"
    on_worker = {f["name"]: f for f in gpu_worker_process.admin.kv_list(slug)}
    assert on_worker["handbook"]["residency"] == "disk"
    audit = AuditLog.objects.get(action="kv_evict", target="handbook")
    assert audit.actor == admin_user and audit.detail["residency_before"] == "device"

    assert owner.delete(f"/api/v1/kv-files/{kv_id}").status_code == 204
    assert "handbook" not in {f["name"] for f in gpu_worker_process.admin.kv_list(slug)}
