"""A database that cannot be reached (down, restarting, or the web process's connection pool
exhausted past ``DATABASE_POOL_TIMEOUT_S``) answers 503 with ``Retry-After`` in the API's error
shape on both front doors, never Django's HTML 500; any other unhandled error is a JSON 500."""

from __future__ import annotations

import pytest
from django.db import OperationalError

from api import authentication
from api.views import openai as openai_views

pytestmark = pytest.mark.django_db


def _refuse(*args, **kwargs):
    raise OperationalError("couldn't get a connection after 10.00 sec")


def test_rest_api_answers_503_database_unavailable(api_tenant_a, monkeypatch):
    client = api_tenant_a.key_client()
    client.raise_request_exception = False
    monkeypatch.setattr(authentication, "verify_key", _refuse)
    response = client.get("/api/v1/programs")
    assert response.status_code == 503, response.content[:300]
    assert response["Content-Type"] == "application/json" and response["Retry-After"] == "1"
    assert response.json()["error"]["code"] == "database_unavailable"


def test_openai_front_door_answers_503_in_openais_envelope(api_tenant_a, monkeypatch):
    client = api_tenant_a.key_client()
    client.raise_request_exception = False
    monkeypatch.setattr(openai_views, "_key", _refuse)
    response = client.get("/v1/models")
    assert response.status_code == 503 and response["Retry-After"] == "1"
    error = response.json()["error"]
    assert error["type"] == "server_error" and error["code"] == "database_unavailable", error


def test_other_unhandled_errors_are_a_json_500(api_tenant_a, monkeypatch):
    client = api_tenant_a.key_client()
    client.raise_request_exception = False

    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(openai_views, "_key", broken)
    response = client.get("/v1/models")
    assert response.status_code == 500 and response.json()["error"]["code"] == "server_error"
    assert "Retry-After" not in response
