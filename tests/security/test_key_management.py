"""Who may mint and revoke a tenant's API keys, and which keys may be minted at all.

A plain member once listed and revoked the owner's keys (cutting off the owner's integrations)
and minted keys with every scope, and none of it reached the audit log. Now a member manages
only the keys they created, an owner manages all, and every mint and revoke is an audit row.
Through the real URL conf, session auth and PostgreSQL."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from rest_framework.test import APIClient

from api.models import ApiKey, AuditLog, Membership
from api.services.keys import verify_key

pytestmark = pytest.mark.django_db

CANARY_S = 5.0


def canary(tenant) -> None:
    """Another tenant's key still reaches the API, promptly."""
    started = time.monotonic()
    response = tenant.key_client().get("/api/v1/programs")
    assert response.status_code == 200, response.content
    assert time.monotonic() - started < CANARY_S


def _member(tenant, email: str) -> APIClient:
    user = get_user_model().objects.create_user(username=email, email=email, password="pw-12345678")
    Membership.objects.create(user=user, tenant=tenant, role="member")
    client = APIClient()
    client.force_login(user)
    return client


def _error(response) -> tuple[int, str, object]:
    body = response.json()["error"]
    return response.status_code, body["code"], body["detail"]


def test_a_member_manages_only_their_own_keys_and_every_change_is_audited(api_tenant_a, api_tenant_b):
    owner_key = ApiKey.objects.get(tenant=api_tenant_a.tenant)
    bob = _member(api_tenant_a.tenant, "bob@example.com")

    assert bob.get("/api/v1/api-keys").json()["count"] == 0  # the owner's key is not his to see
    assert _error(bob.delete(f"/api/v1/api-keys/{owner_key.pk}"))[:2] == (404, "not_found")
    assert verify_key(api_tenant_a.key_secret) is not None

    minted = bob.post("/api/v1/api-keys", {"name": "bob-ci", "scopes": ["runs"]}, format="json")
    assert minted.status_code == 201, minted.content
    created = AuditLog.objects.get(action="api_key.create", tenant=api_tenant_a.tenant)
    assert created.actor.email == "bob@example.com" and created.detail["scopes"] == ["runs"]
    assert minted.json()["prefix"] in created.target
    assert [k["id"] for k in bob.get("/api/v1/api-keys").json()["results"]] == [minted.json()["id"]]

    owner = api_tenant_a.session_client()
    assert owner.get("/api/v1/api-keys").json()["count"] == 2  # an owner sees every key
    assert owner.delete(f"/api/v1/api-keys/{minted.json()['id']}").status_code == 204
    assert owner.delete(f"/api/v1/api-keys/{minted.json()['id']}").status_code == 204  # idempotent
    revoked = AuditLog.objects.get(action="api_key.revoke", tenant=api_tenant_a.tenant)
    assert revoked.actor == api_tenant_a.user and revoked.detail["created_by"] == "bob@example.com"
    assert verify_key(minted.json()["secret"]) is None
    canary(api_tenant_b)


def test_a_key_with_no_scopes_or_born_expired_is_refused(api_tenant_a, api_tenant_b):
    owner = api_tenant_a.session_client()
    status, code, detail = _error(owner.post("/api/v1/api-keys", {"name": "k", "scopes": []}, format="json"))
    assert (status, code) == (400, "invalid") and "scopes" in detail
    past = (timezone.now() - timedelta(minutes=1)).isoformat()
    status, code, detail = _error(owner.post("/api/v1/api-keys", {"name": "k", "expires_at": past}, format="json"))
    assert (status, code) == (400, "invalid") and "expires_at" in detail
    assert ApiKey.objects.filter(tenant=api_tenant_a.tenant).count() == 1
    future = (timezone.now() + timedelta(days=1)).isoformat()
    ok = owner.post("/api/v1/api-keys", {"name": "k", "expires_at": future}, format="json")
    assert ok.status_code == 201 and sorted(ok.json()["scopes"]) == ["kv", "programs", "runs", "usage"]
    canary(api_tenant_b)
