"""API keys: issue/verify/revoke/expiry, bearer auth, signup/login/me, error format."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.core import mail as outbox
from django.utils import timezone
from rest_framework.test import APIClient

from api.models import ApiKey
from api.services import accounts, mail
from api.services.keys import issue_key, revoke_key, verify_key

pytestmark = pytest.mark.django_db


def test_key_verifies_and_is_stored_hashed(api_tenant_a):
    issued = issue_key(api_tenant_a.tenant, "k", [])
    assert verify_key(issued.secret).pk == issued.key.pk
    stored = ApiKey.objects.get(pk=issued.key.pk)
    assert issued.secret.split("_", 2)[2] not in stored.secret_hash
    assert stored.last_used_at is not None


def test_last_used_at_is_written_at_most_once_a_minute(api_tenant_a):
    issued = issue_key(api_tenant_a.tenant, "k", [])
    verify_key(issued.secret)
    first = ApiKey.objects.get(pk=issued.key.pk).last_used_at
    verify_key(issued.secret)
    assert ApiKey.objects.get(pk=issued.key.pk).last_used_at == first
    stale = first - timedelta(minutes=2)
    ApiKey.objects.filter(pk=issued.key.pk).update(last_used_at=stale)
    verify_key(issued.secret)
    assert ApiKey.objects.get(pk=issued.key.pk).last_used_at > first


def test_wrong_revoked_and_expired_keys_are_rejected(api_tenant_a):
    issued = issue_key(api_tenant_a.tenant, "k", [])
    assert verify_key(issued.secret[:-1] + ("A" if issued.secret[-1] != "A" else "B")) is None
    assert verify_key("not-a-key") is None
    expired = issue_key(api_tenant_a.tenant, "old", [], expires_at=timezone.now() - timedelta(seconds=1))
    assert verify_key(expired.secret) is None
    revoke_key(issued.key)
    assert verify_key(issued.secret) is None


def test_bearer_auth_and_error_shape(api_tenant_a):
    response = api_tenant_a.key_client().get("/api/v1/auth/me")
    assert response.status_code == 200
    assert response.json()["active_tenant"] == api_tenant_a.tenant.pk
    bad = APIClient()
    bad.credentials(HTTP_AUTHORIZATION="Bearer sk_nope_nope")
    response = bad.get("/api/v1/programs")
    assert response.status_code == 401
    assert set(response.json()["error"]) == {"code", "message", "detail"}
    assert APIClient().get("/api/v1/runs").status_code in (401, 403)


def test_signup_with_an_email_longer_than_the_username_column_is_a_400():
    """The email is the username (150 characters): a longer, otherwise valid address is refused
    with a message instead of failing at the database."""
    email = "a" * 64 + "@" + "b" * 63 + "." + "c" * 30 + ".com"  # 163 characters, valid
    response = APIClient().post(
        "/api/v1/auth/signup", {"email": email, "password": "long-pass-123", "tenant_name": "Long"}, format="json"
    )
    assert response.status_code == 400, response.content
    assert "email" in response.json()["error"]["detail"]


def _verification_token(email: str) -> str:
    """The token of the verification link the mail task sends ``email`` (its body, run here
    against Django's test outbox; the whole HTTP -> Celery -> SMTP path is
    tests/security/test_accounts_abuse.py)."""
    user = get_user_model().objects.get(email=email)
    assert mail.send_verification(email, accounts.verification_token(user))
    found = re.search(r"/verify-email/(\S+)", outbox.outbox[-1].body)
    assert found, outbox.outbox[-1].body
    return found.group(1)


def test_signup_login_me_and_key_lifecycle_over_http():
    client = APIClient()
    response = client.post(
        "/api/v1/auth/signup",
        {"email": "Ann@example.com", "password": "long-pass-123", "tenant_name": "Ann Co"},
        format="json",
    )
    assert response.status_code == 201, response.content
    assert response.json()["tenants"][0]["role"] == "owner"
    client.post("/api/v1/auth/logout")
    assert (
        client.post("/api/v1/auth/login", {"email": "ann@example.com", "password": "wrong"}, format="json").status_code
        == 401
    )
    assert (
        client.post(
            "/api/v1/auth/login", {"email": "ann@example.com", "password": "long-pass-123"}, format="json"
        ).status_code
        == 200
    )
    # Not before the address is verified, through the link mailed to it.
    refused = client.post("/api/v1/api-keys", {"name": "ci", "scopes": ["runs"]}, format="json")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "email_unverified"
    assert "ann@example.com" in refused.json()["error"]["message"]
    assert client.get("/api/v1/auth/me").json()["user"]["email_verified"] is False
    client.post("/api/v1/auth/verify-email", {"token": _verification_token("ann@example.com")}, format="json")
    assert client.get("/api/v1/auth/me").json()["user"]["email_verified"] is True
    created = client.post("/api/v1/api-keys", {"name": "ci", "scopes": ["runs"]}, format="json")
    assert created.status_code == 201
    secret = created.json()["secret"]
    assert secret.startswith("sk_") and "secret" not in client.get("/api/v1/api-keys").json()["results"][0]
    key_client = APIClient()
    key_client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert key_client.get("/api/v1/runs").status_code == 200
    assert client.delete(f"/api/v1/api-keys/{created.json()['id']}").status_code == 204
    assert key_client.get("/api/v1/runs").status_code == 401


def test_key_scopes_limit_what_a_key_can_reach(api_tenant_a):
    runs_only = APIClient()
    runs_only.credentials(HTTP_AUTHORIZATION=f"Bearer {issue_key(api_tenant_a.tenant, 'r', ['runs']).secret}")
    assert runs_only.get("/api/v1/runs").status_code == 200
    assert runs_only.get("/api/v1/programs").status_code == 403
    assert runs_only.get("/api/v1/usage").status_code == 403
    # No scope lets a key manage keys: a leaked key cannot mint or revoke others.
    full = api_tenant_a.key_client()
    assert full.get("/api/v1/programs").status_code == 200
    assert full.get("/api/v1/api-keys").status_code == 403
    assert full.post("/api/v1/api-keys", {"name": "x"}, format="json").status_code == 403
    console = api_tenant_a.session_client()
    bad_scope = console.post("/api/v1/api-keys", {"name": "x", "scopes": ["root"]}, format="json")
    assert bad_scope.status_code == 400
    default = console.post("/api/v1/api-keys", {"name": "y"}, format="json").json()
    assert sorted(default["scopes"]) == ["kv", "programs", "runs", "usage"]


def test_rotating_secret_key_keeps_keys_working_through_the_fallbacks(api_tenant_a, settings):
    """Django's rotation scheme: the old SECRET_KEY moves to SECRET_KEY_FALLBACKS. A key made
    under it still verifies and is re-hashed under the new key on that use, so it keeps working
    once the fallback is dropped; a key never used during the rotation stops working then."""
    used = issue_key(api_tenant_a.tenant, "used", [])
    idle = issue_key(api_tenant_a.tenant, "idle", [])
    old_key = settings.SECRET_KEY
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = "rotated-" + old_key, [old_key]

    assert verify_key(used.secret).pk == used.key.pk
    stored = ApiKey.objects.get(pk=used.key.pk)
    assert stored.secret_hash != used.key.secret_hash  # now under the new key

    settings.SECRET_KEY_FALLBACKS = []
    assert verify_key(used.secret).pk == used.key.pk
    assert verify_key(idle.secret) is None
    assert verify_key(used.secret[:-1] + ("A" if used.secret[-1] != "A" else "B")) is None
