"""KV file mirror when the worker cannot be reached: listing serves the last mirror marked stale,
mutations answer 503 and change nothing, staff eviction is staff-only and audited only on success."""

from __future__ import annotations

import pytest

from api.models import AuditLog, KVFile

pytestmark = pytest.mark.django_db


@pytest.fixture
def kv(api_tenant_a, settings, tmp_path) -> KVFile:
    settings.SYMPHONY_WORKER_ADMIN_SOCKET = str(tmp_path / "absent.sock")
    return KVFile.objects.create(tenant=api_tenant_a.tenant, worker="local", name="doc", tokens=12, residency="host")


def test_list_serves_stale_mirror_and_mutations_fail_cleanly(api_tenant_a, kv):
    client = api_tenant_a.key_client()
    listing = client.get("/api/v1/kv-files")
    assert listing.status_code == 200 and listing["X-Symphony-Stale"] == "1"
    assert [f["name"] for f in listing.json()["results"]] == ["doc"]
    assert client.get(f"/api/v1/kv-files/{kv.pk}").json()["tokens"] == 12
    for response in (
        client.delete(f"/api/v1/kv-files/{kv.pk}"),
        client.post(f"/api/v1/kv-files/{kv.pk}/pin", {"pinned": True}, format="json"),
    ):
        assert response.status_code == 503 and response.json()["error"]["code"] == "worker_unavailable"
    kv.refresh_from_db()
    assert not kv.pinned


def test_staff_evict_is_staff_only_and_not_audited_on_failure(api_tenant_a, api_tenant_b, kv):
    assert api_tenant_a.session_client().get("/api/v1/admin/kv-files").status_code == 403
    api_tenant_b.user.is_staff = True
    api_tenant_b.user.save()
    staff = api_tenant_b.session_client()
    assert [f["tenant"] for f in staff.get("/api/v1/admin/kv-files").json()["results"]] == ["alpha"]
    assert staff.post(f"/api/v1/admin/kv-files/{kv.pk}/evict").status_code == 503
    assert not AuditLog.objects.exists()
