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


def test_quota_shows_the_plans_kv_shares_and_the_file_count(api_tenant_a, kv):
    """The free plan's shares from migration 0012, and the files the tenant has."""
    body = api_tenant_a.key_client().get("/api/v1/quota").json()
    limits = body["limits"]
    assert (limits["kv_pinned_device_share"], limits["kv_host_share"], limits["max_kv_files"]) == (0.1, 0.1, 100)
    assert body["use"]["kv_files"] == 1


def test_last_used_is_iso_8601_like_every_other_timestamp(api_tenant_a, kv):
    kv.last_used = 1767225600.25  # what the worker reports: Unix seconds
    kv.save()
    body = api_tenant_a.key_client().get(f"/api/v1/kv-files/{kv.pk}").json()
    assert body["last_used"] == "2026-01-01T00:00:00.250000Z"
    kv.last_used = None
    kv.save()
    assert api_tenant_a.key_client().get(f"/api/v1/kv-files/{kv.pk}").json()["last_used"] is None


def test_quota_shows_the_accounts_stored_bytes_beside_the_tenants(api_tenant_a, api_tenant_b):
    """The plan's ``kv_bytes_stored`` and ``max_kv_files`` bound every tenant of one person
    together (the worker counts them as one), so the quota shows those figures too; another
    person's files are not in them."""
    from api.models import Tenant

    sibling = Tenant.objects.create(name="second", slug="alpha-2", account=api_tenant_a.user)
    Tenant.objects.filter(pk=api_tenant_a.tenant.pk).update(account=api_tenant_a.user)
    KVFile.objects.create(tenant=api_tenant_a.tenant, worker="local", name="a", residency="disk", bytes=300)
    KVFile.objects.create(tenant=sibling, worker="local", name="b", residency="disk", bytes=500)
    KVFile.objects.create(tenant=api_tenant_b.tenant, worker="local", name="c", residency="disk", bytes=7000)
    use = api_tenant_a.key_client().get("/api/v1/quota").json()["use"]
    assert (use["kv_bytes_stored"], use["account_kv_bytes_stored"]) == (300, 800)
    assert (use["kv_files"], use["account_kv_files"]) == (1, 2)
