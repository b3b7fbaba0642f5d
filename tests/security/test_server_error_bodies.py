"""No 5xx body carries a traceback or a server path; the log carries both under a request id
the body returns (api/services/server_errors.py).

A failed built-in /v1 run put its error text (the program's frames, with the path of
``api/builtin_lips/openai_lip.py``) in the 500 body, and a worker that could not be reached
put its socket error in the REST API's 503; an unhandled error's 500 said nothing, but logged
nothing a client could point at either. The requests here go through the
real ASGI application (web/asgi.py) in-process, on the test database."""

from __future__ import annotations

import json
import logging

import pytest

from api import authentication
from api.models import KVFile, Run
from api.services import openai_requests, responses, trusted_runs
from api.views import openai as openai_views

# Imported at collection: its first import of web.asgi sets Django up again (logging included),
# which would drop the log capture of the test that imported it.
from tests.asgi_request import asgi_request

pytestmark = pytest.mark.django_db

LOGGER = "symphony.server_errors"


def _asgi(method: str, path: str, secret: str, body: bytes = b"") -> tuple[int, dict]:
    """One request through the real ASGI application, in this thread (the test's transaction)."""
    headers = [(b"authorization", f"Bearer {secret}".encode())]
    if body:
        headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    response = asgi_request(method, path, headers, body, scheme="https")
    return response.status, json.loads(response.body)


def _logged(caplog, request_id: str) -> logging.LogRecord:
    records = [r for r in caplog.records if r.name == LOGGER and request_id in r.getMessage()]
    assert len(records) == 1, [r.getMessage() for r in caplog.records if r.name == LOGGER]
    return records[0]


def _assert_says_nothing_of_the_server(body: dict, *secrets: str) -> str:
    text = json.dumps(body)
    for secret in ("Traceback", "/api/", ".py", *secrets):
        assert secret not in text, (secret, body)
    request_id = body["error"]["request_id"]
    assert request_id.startswith("req_"), body
    return request_id


@pytest.mark.parametrize("debug", [False, True], ids=["debug-off", "debug-on"])
@pytest.mark.parametrize("path", ["/api/v1/programs", "/v1/models"])
def test_an_unhandled_error_is_a_generic_500_and_its_traceback_is_logged_under_the_id(
    api_tenant_a, monkeypatch, caplog, settings, path, debug
):
    """With DJANGO_DEBUG on too (the local stack's default), where Django's own answer is its
    HTML page with the traceback (web/api_errors.py)."""
    settings.DEBUG = debug
    where = str(trusted_runs.BUILTIN_SOURCE)

    def broken(*args, **kwargs):
        raise RuntimeError(f"a bug at {where}")

    monkeypatch.setattr(authentication, "verify_key", broken)
    monkeypatch.setattr(openai_views, "_key", broken)
    caplog.set_level(logging.ERROR, logger=LOGGER)
    status, body = _asgi("GET", path, api_tenant_a.key_secret)
    assert status == 500, body
    request_id = _assert_says_nothing_of_the_server(body, where, "a bug")
    record = _logged(caplog, request_id)
    assert record.exc_info is not None and where in str(record.exc_info[1]), record.getMessage()


def test_an_unreachable_worker_is_a_503_without_its_socket_error(api_tenant_a, settings, tmp_path, caplog):
    socket = tmp_path / "absent-admin.sock"
    settings.SYMPHONY_WORKER_ADMIN_SOCKET = str(socket)
    kv = KVFile.objects.create(tenant=api_tenant_a.tenant, worker="local", name="doc", tokens=12, residency="host")
    caplog.set_level(logging.ERROR, logger=LOGGER)
    status, body = _asgi("DELETE", f"/api/v1/kv-files/{kv.pk}", api_tenant_a.key_secret)
    assert status == 503 and body["error"]["code"] == "worker_unavailable", body
    request_id = _assert_says_nothing_of_the_server(body, str(tmp_path), "Errno", "FileNotFoundError")
    record = _logged(caplog, request_id)
    assert "FileNotFoundError" in record.getMessage() and record.exc_info is not None


def _failed_builtin_run(tenant) -> Run:
    """A run of the built-in program that failed as the in-process runner records it: its
    error is ``Type: message`` and the program's frames, with the program's server path."""
    code = compile("def main():\n    raise ValueError('worker said no')\n", str(trusted_runs.BUILTIN_SOURCE), "exec")
    namespace: dict = {}
    exec(code, namespace)
    try:
        namespace["main"]()
    except ValueError as exc:
        error = trusted_runs._error_summary(exc)
    assert str(trusted_runs.BUILTIN_SOURCE) in error and "Traceback" in error
    version = openai_requests.builtin_program(tenant).versions.order_by("-number").first()
    return Run.objects.create(tenant=tenant, program_version=version, status="failed", error=error)


def test_a_failed_v1_run_answers_its_id_and_a_request_id_never_its_traceback(api_tenant_a, caplog):
    run = _failed_builtin_run(api_tenant_a.tenant)
    caplog.set_level(logging.ERROR, logger=LOGGER)
    response = openai_views._failure(run)
    assert response.status_code == 500
    body = json.loads(response.content)
    request_id = _assert_says_nothing_of_the_server(body, "worker said no")
    assert str(run.pk) in body["error"]["message"] and body["error"]["type"] == "server_error"
    logged = _logged(caplog, request_id).getMessage()
    assert str(run.pk) in logged and "builtin_lips" in logged and "worker said no" in logged
    # A stored response of that run shows no more of it.
    stored = json.dumps(responses.outcome(run)["error"])
    assert "Traceback" not in stored and "builtin_lips" not in stored and str(run.pk) in stored


@pytest.mark.parametrize("debug", [False, True], ids=["debug-off", "debug-on"])
@pytest.mark.parametrize(
    ("path", "code"),
    [("/api/v1/no-such-thing", "not_found"), ("/api/no-such-thing", "not_found"), ("/v1/no-such-thing", "not_found")],
)
def test_an_unknown_api_path_is_the_apis_404_never_djangos_page(api_tenant_a, settings, path, code, debug):
    """Django's debug 404 page lists every route of the service; the API's envelope says only
    that the path has none."""
    settings.DEBUG = debug
    for method in ("GET", "POST"):  # a POST is a 404 too, not a CSRF refusal
        status, body = _asgi(method, path, api_tenant_a.key_secret)
        assert status == 404, (method, body)
        error = body["error"]
        assert error.get("code") == code, body
        assert "api-keys" not in json.dumps(body) and "urlpatterns" not in json.dumps(body)
