"""Property-based fuzzing of the REST API against its own OpenAPI schema.

Schemathesis derives requests from ``/api/schema/`` (what drf-spectacular publishes, so a route
added later is fuzzed without touching this file) and sends them in-process to the WSGI
application, on the pytest-django test database. Both schema-conforming ("positive") and
schema-violating ("negative") requests are generated, for two principals: a tenant API key
with every scope, and a console session (cookie + CSRF token), because the two reach different
code (key management is console-only, CSRF applies only to sessions).

Properties, for every response:

* never a 5xx: a hostile or sloppy client must not be able to make the server fail (the one
  exception is 503 ``worker_unavailable`` from KV routes, since the worker is absent here);
* every 4xx from the API is the documented envelope ``{"error": {"code", "message", "detail"}}``
  with a string code and message, so clients can rely on one error shape (docs/API.md).

Runs are created inside the test transaction, so ``transaction.on_commit`` never enqueues a
Celery task: nothing leaks into Redis or reaches a worker. Bounded by ``max_examples`` per
principal and mode (about a minute in total on 2 cores).
"""

from __future__ import annotations

import json
import time

import pytest
import schemathesis
from django.middleware.csrf import _get_new_csrf_string
from django.test import Client
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

pytestmark = [pytest.mark.integration, pytest.mark.django_db, pytest.mark.timeout(300)]

#: Examples per (principal, generation mode); 4 combinations in total.
MAX_EXAMPLES = 200
#: Hard stop per combination, whatever hypothesis decides (seconds).
BUDGET_S = 25.0


@pytest.fixture
def wsgi_app():
    """The project's WSGI application, with Django's per-request connection closing switched off
    for the test (as django.test.Client does): the requests share the test's transaction."""
    from django.core.signals import request_finished, request_started
    from django.db import close_old_connections

    from web.wsgi import application

    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield application
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


@pytest.fixture
def api_schema(wsgi_app):
    """The live schema served by the app itself (not a copy), loaded through schemathesis.
    Without the plain views the schema describes too (api/openapi_extra.py): ``/v1/*`` answer in
    OpenAI's envelope and are fuzzed by test_openai_fuzz.py, and the events stream never ends
    for a live run, which a request-per-example fuzzer cannot read."""
    schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", wsgi_app)
    return schema.exclude(path_regex=r"^/v1/|/events$")


@pytest.fixture
def seeded(api_tenant_a, api_tenant_b, settings, tmp_path):
    """Real objects for tenant A (so small generated ids hit existing rows) and a worker socket
    that does not exist (KV pin/evict paths must then answer 503 with the envelope, not 500)."""
    from api.models import KVFile, Program
    from api.services import programs
    from api.services.runs import create_run

    settings.SYMPHONY_WORKER_ADMIN_SOCKET = str(tmp_path / "absent.sock")
    settings.SYMPHONY_ROUTING = "static"
    for owner in (api_tenant_a, api_tenant_b):
        prog = Program.objects.create(tenant=owner.tenant, name=f"fuzz-{owner.tenant.slug}")
        programs.add_version(prog, "p.py", b"def main(args):\n    return args\n")
        create_run(owner.tenant, prog, None, {"x": 1}, {})
        KVFile.objects.create(tenant=owner.tenant, worker="local", name="doc", residency="disk")
    return api_tenant_a


def _session_credentials(user) -> tuple[dict[str, str], dict[str, str]]:
    """Headers and cookies of a fresh console session (what the React console sends)."""
    client = Client()
    client.force_login(user)
    csrf = _get_new_csrf_string()
    return {"X-CSRFToken": csrf}, {"sessionid": client.cookies["sessionid"].value, "csrftoken": csrf}


def _check(case, response) -> None:
    where = f"{case.method} {case.formatted_path} query={case.query!r} body={str(case.body)[:300]}"
    if response.status_code == 503:
        # The only 5xx allowed: the seeded worker socket is absent on purpose, and KV calls
        # that need the worker must say so with the envelope (not crash).
        assert response.json()["error"]["code"] == "worker_unavailable", (where, response.text[:500])
        return
    assert response.status_code < 500, f"{response.status_code} for {where}:\n{response.text[:2000]}"
    if 400 <= response.status_code < 500:
        try:
            body = json.loads(response.content or b"null")
        except ValueError:
            pytest.fail(f"{response.status_code} without a JSON body for {where}: {response.text[:300]!r}")
        assert isinstance(body, dict) and isinstance(body.get("error"), dict), (where, body)
        err = body["error"]
        assert set(err) == {"code", "message", "detail"}, (where, err)
        assert isinstance(err["code"], str) and isinstance(err["message"], str), (where, err)


#: Routes that serve people, not programs: an API key is refused there by design (403).
CONSOLE_ONLY = (
    "/api/v1/api-keys",
    "/api/v1/members",
    "/api/v1/invitations",
    "/api/v1/audit-log",
    "/api/v1/tenants",
    "/api/v1/auth/password",
    "/api/v1/auth/switch-tenant",
    "/api/v1/auth/invitations/",
    "/api/v1/auth/verify-email/resend",
)


def _fuzz(schema, mode: GenerationMode, credentials) -> dict[int | str, int]:
    """Run ``MAX_EXAMPLES`` generated cases; returns a histogram of status codes."""
    statuses: dict[int, int] = {}
    deadline = time.monotonic() + BUDGET_S
    strategy = schema.as_strategy(generation_mode=mode)

    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def run(case) -> None:
        if time.monotonic() > deadline:
            return
        if case.headers:
            # Negative mode also fuzzes the security schemes (a bogus Bearer header or sessionid
            # cookie); those are answered 401 before any view runs, which the auth tests cover.
            # Drop them so every example exercises the principal under test.
            for name in [h for h in case.headers if h.lower() in ("authorization", "cookie")]:
                del case.headers[name]
        if case.cookies:
            case.cookies.clear()
        headers, cookies = credentials()
        response = case.call(headers=headers, cookies=cookies)
        bucket = response.status_code
        if bucket == 403 and case.path.startswith(CONSOLE_ONLY):
            bucket = "403 console-only"  # expected for API keys; kept out of the coverage check
        statuses[bucket] = statuses.get(bucket, 0) + 1
        _check(case, response)

    run()
    return statuses


def _assert_authenticated_coverage(statuses: dict[int | str, int]) -> None:
    """Fuzzing that mostly saw 401s would prove nothing about the authenticated code paths."""
    print(f"status histogram: {statuses}")
    total = sum(n for status, n in statuses.items() if isinstance(status, int))
    assert total >= 30, statuses
    assert statuses.get(401, 0) + statuses.get(403, 0) < total / 2, statuses
    assert any(isinstance(s, int) and 200 <= s < 300 for s in statuses), statuses


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=["positive", "negative"])
def test_api_key_requests_never_500_and_errors_have_one_shape(api_schema, seeded, mode):
    def credentials():
        return {"Authorization": f"Bearer {seeded.key_secret}"}, {}

    statuses = _fuzz(api_schema, mode, credentials)
    _assert_authenticated_coverage(statuses)


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=["positive", "negative"])
def test_console_session_requests_never_500_and_errors_have_one_shape(api_schema, seeded, mode):
    # A fresh session per example: a generated POST /auth/logout or switch-tenant must not
    # silently turn the rest of the run into anonymous requests.
    statuses = _fuzz(api_schema, mode, lambda: _session_credentials(seeded.user))
    _assert_authenticated_coverage(statuses)


def test_session_writes_without_csrf_token_are_refused(api_schema, seeded):
    """The CSRF half of the session principal: the same cookie without the token is refused for
    every unsafe operation in the schema, with the error envelope (DRF SessionAuthentication)."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(seeded.user)
    checked = 0
    for result in api_schema.get_all_operations():
        operation = result.ok()
        if operation.method.upper() not in ("POST", "PUT", "PATCH", "DELETE"):
            continue
        if operation.path.startswith("/api/v1/auth/password-reset") or operation.path in (
            "/api/v1/auth/email/confirm",
            "/api/v1/auth/verify-email",
        ):
            continue  # no session is read at all: the email or the link's token is the whole request
        path = operation.path.replace("{id}", "1").replace("{number}", "1").replace("{month}", "2026-11")
        path = path.replace("{tenant_id}", "1")
        response = client.generic(operation.method.upper(), path, b"{}", content_type="application/json")
        assert response.status_code == 403, (operation.method, path, response.status_code)
        assert "CSRF" in response.json()["error"]["message"], response.json()
        checked += 1
    assert checked >= 8, checked


def test_unrouted_api_paths_use_the_envelope(wsgi_app, seeded):
    """Found by the fuzzer: ``/api/v1/programs/1.5`` or ``/api/v1/invoices/2026-13`` never reach
    DRF, so the API's one error shape is broken for them."""
    client = Client()
    for path in ("/api/v1/programs/1.5", "/api/v1/invoices/2026-13", "/api/v1/no-such-route"):
        response = client.get(path, HTTP_AUTHORIZATION=f"Bearer {seeded.key_secret}")
        assert response.status_code == 404, path
        assert response.headers["Content-Type"].startswith("application/json"), path
        assert set(response.json()["error"]) == {"code", "message", "detail"}, path


def test_invoice_month_out_of_date_range_is_404(seeded):
    """Found by the fuzzer: the URL regex accepts year 0000, and 9999-12 needs year 10000 for the
    end of the range; both are outside ``datetime.date``."""
    client = seeded.key_client()
    for month in ("0000-01", "9999-12"):
        response = client.get(f"/api/v1/invoices/{month}")
        assert response.status_code == 404, (month, response.status_code)
        assert set(response.json()["error"]) == {"code", "message", "detail"}


def test_switch_tenant_rejects_malformed_bodies_with_400(seeded):
    """Found by the fuzzer (console session): ``[]``, ``true``, ``{"tenant": "abc"}`` and
    ``{"tenant": [1]}`` each crash the view."""
    client = seeded.session_client()
    for body in ([], True, {"tenant": "abc"}, {"tenant": [1]}):
        response = client.post("/api/v1/auth/switch-tenant", body, format="json")
        assert response.status_code == 400, (body, response.status_code)
        assert set(response.json()["error"]) == {"code", "message", "detail"}
