"""Authentication is required on every API route except the public ones, checked by walking
the URL configuration so a route added later cannot be forgotten."""

from __future__ import annotations

import re

import pytest
from django.urls import URLPattern, URLResolver, get_resolver
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db

#: Answered without credentials. An invitation's preview is public: its token is the credential
#: (accepting it needs a signed-in user, and is checked below like every other route); so is a
#: password-reset, email-change or email-verification link's (asking for a reset names an email,
#: and answers the same for any).
PUBLIC = {
    "api/v1/health",
    "api/v1/auth/signup",
    "api/v1/auth/login",
    "api/v1/auth/csrf",
    "api/v1/auth/invitations/<str:token>",
    "api/v1/auth/password-reset",
    "api/v1/auth/password-reset/confirm",
    "api/v1/auth/email/confirm",
    "api/v1/auth/verify-email",
    # OpenAI-shaped 404s to everyone (nothing behind them): embeddings, unknown /v1 routes.
    "v1/embeddings",
    "v1/^(?P<rest>.*)",
}
SAMPLE_ARGS = {
    "pk": "1",
    "run_id": "00000000-0000-0000-0000-000000000001",
    "month": "2026-11",
    "number": "1",
}


def _routes(resolver: URLResolver, prefix: str = ""):
    for entry in resolver.url_patterns:
        pattern = prefix + str(entry.pattern)
        if isinstance(entry, URLResolver):
            yield from _routes(entry, pattern)
        elif isinstance(entry, URLPattern):
            yield pattern


def _concrete(pattern: str) -> str | None:
    """A request path for ``pattern`` with sample arguments (None for the console catch-all)."""
    if "(?P<route>" in pattern or "format" in pattern:
        return None
    path = _fill_regex_groups(pattern)
    path = re.sub(r"<(?:\w+:)?(\w+)>", lambda m: SAMPLE_ARGS.get(m.group(1), "1"), path)
    return "/" + path.replace("^", "").replace("$", "").replace("\\", "")


def _fill_regex_groups(path: str) -> str:
    """Replace each ``(?P<name>...)`` (parentheses may nest) with its sample argument."""
    while (start := path.find("(?P<")) >= 0:
        name = path[start + 4 : path.index(">", start)]
        depth, end = 0, start
        for end in range(start, len(path)):
            depth += {"(": 1, ")": -1}.get(path[end], 0)
            if depth == 0:
                break
        path = path[:start] + SAMPLE_ARGS.get(name, "1") + path[end + 1 :]
    return path


def test_every_api_route_refuses_anonymous_callers():
    client = APIClient()
    checked = 0
    for pattern in _routes(get_resolver()):
        path = _concrete(pattern)
        if path is None or not path.startswith(("/api/v1/", "/v1/")) or pattern.strip("/^$") in PUBLIC:
            continue
        for method in ("get", "post", "delete"):
            status = getattr(client, method)(path).status_code
            assert status in (401, 403, 405), (method, path, status)
        checked += 1
    assert checked >= 20, f"only {checked} routes found: the walk is broken"


def test_public_routes_answer_without_credentials():
    client = APIClient()
    assert client.get("/api/v1/health").status_code == 200
    assert client.get("/api/v1/auth/csrf").status_code == 200
