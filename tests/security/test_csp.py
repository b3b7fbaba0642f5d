"""Every page carries a Content-Security-Policy, the one its kind of page can live with.

There was none: a script injected into the console (through any future XSS) would run with the
user's session. tests/browser/test_console.py proves in real Chromium that the policies refuse an
injected script and break none of the pages; this checks each response kind has its policy,
through the real middleware stack and URL conf."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.asgi_request import asgi_request

pytestmark = pytest.mark.django_db

HEADER = "Content-Security-Policy"


def _directives(response) -> dict[str, str]:
    policy = response.headers[HEADER]
    return {part.split(" ", 1)[0]: part.split(" ", 1)[1] for part in policy.split("; ")}


@pytest.mark.parametrize("path", ["/", "/programs", "/login"])
def test_the_console_may_run_only_its_own_scripts_and_styles(path):
    response = Client().get(path)
    assert response.status_code in (200, 503)  # 503: the console is not built here
    policy = _directives(response)
    assert policy["script-src"] == "'self'" and policy["style-src"] == "'self'"
    assert policy["object-src"] == "'none'" and policy["frame-ancestors"] == "'none'"
    assert policy["base-uri"] == "'none'"


def test_the_admin_and_browsable_api_allow_inline_styles_never_inline_scripts(api_tenant_a):
    for response in (
        Client().get("/admin/login/"),
        Client().get("/api/v1/auth/csrf", HTTP_ACCEPT="text/html"),
        api_tenant_a.key_client().get("/api/v1/programs"),
    ):
        assert response.status_code == 200, response.content[:200]
        policy = _directives(response)
        assert policy["script-src"] == "'self'" and "'unsafe-inline'" in policy["style-src"]


def test_swagger_ui_has_no_inline_script_and_loads_only_from_this_origin():
    page = Client().get("/api/docs/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "<script>" not in html  # the start-up script is a file of its own
    policy = _directives(page)
    assert policy["script-src"] == "'self'"  # its files are served from the package (SIDECAR), no CDN
    script = Client().get("/api/docs/?script=")
    assert script.status_code == 200 and "SwaggerUIBundle" in script.content.decode()


def test_the_openai_endpoints_and_errors_carry_the_policy_too():
    assert HEADER in Client().get("/v1/models").headers
    assert HEADER in Client().get("/api/v1/no-such-route").headers


def test_the_probes_answered_before_the_rest_of_django_carry_the_policy():
    """The health probe and /metrics answer from middleware ahead of host validation; the policy
    once came after them, so /api/v1/health was the one API response without it."""
    for response in (Client().get("/api/v1/health"), Client().head("/api/v1/health"), Client().get("/metrics")):
        assert response.status_code in (200, 403, 503), response.content[:200]
        assert _directives(response)["frame-ancestors"] == "'none'", response.headers


def _asgi_request(method: str, path: str, headers: list[tuple[bytes, bytes]]) -> tuple[int, dict[bytes, bytes]]:
    response = asgi_request(method, path, headers)
    return response.status, response.headers


def test_every_asgi_response_carries_the_policy_those_refused_in_front_of_django_included(settings):
    status, headers = _asgi_request("GET", "/api/v1/health", [])
    assert status == 200 and b"frame-ancestors 'none'" in headers[HEADER.lower().encode()]
    too_big = str(settings.SYMPHONY_MAX_REQUEST_BYTES + 1).encode()
    status, headers = _asgi_request("POST", "/api/v1/programs", [(b"content-length", too_big)])
    assert status == 413 and HEADER.lower().encode() in headers, headers
