"""Sign-in and sign-up need Django's CSRF token, signed in or not (login CSRF).

DRF enforces CSRF only for requests its session authentication authenticated, so an anonymous
POST to ``/auth/login`` or ``/auth/signup`` needed no token: a hostile page could sign a
visitor's browser into the attacker's account. Now both are refused without the token, with a
403 in the error envelope, and work as the console calls them (``GET /auth/csrf``, then the
``X-CSRFToken`` header). Through the real URL conf, middleware, sessions and PostgreSQL, with a
test client that enforces CSRF as a browser's requests are."""

from __future__ import annotations

import time

import pytest
from django.core.cache import cache
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db

CANARY_S = 5.0


@pytest.fixture(autouse=True)
def _fresh_throttle_counters():
    cache.clear()


def _forged(path: str, body: dict):
    """A cross-site form post: the browser has no token to send (another site cannot read it)."""
    return APIClient(enforce_csrf_checks=True).post(path, body, format="json")


def _as_the_console(path: str, body: dict):
    client = APIClient(enforce_csrf_checks=True)
    token = client.get("/api/v1/auth/csrf").json()["csrftoken"]
    return client.post(path, body, format="json", HTTP_X_CSRFTOKEN=token)


def _canary(tenant) -> None:
    started = time.monotonic()
    assert tenant.key_client().get("/api/v1/programs").status_code == 200
    assert time.monotonic() - started < CANARY_S


def test_login_without_the_csrf_token_is_refused(api_tenant_a, api_tenant_b):
    body = {"email": "alpha@example.com", "password": "pw-12345678"}
    forged = _forged("/api/v1/auth/login", body)
    assert forged.status_code == 403, forged.content
    error = forged.json()["error"]
    assert error["code"] == "permission_denied" and "CSRF" in error["message"]
    assert "sessionid" not in forged.cookies
    assert _as_the_console("/api/v1/auth/login", body).status_code == 200
    _canary(api_tenant_b)


def test_signup_without_the_csrf_token_is_refused(api_tenant_b):
    body = {"email": "mallory@example.com", "password": "long-pass-123", "tenant_name": "Mallory"}
    forged = _forged("/api/v1/auth/signup", body)
    assert forged.status_code == 403, forged.content
    assert "CSRF" in forged.json()["error"]["message"]
    assert _as_the_console("/api/v1/auth/signup", body).status_code == 201
    _canary(api_tenant_b)
