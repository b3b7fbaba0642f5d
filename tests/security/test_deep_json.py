"""JSON nested thousands of levels deep, through the real ASGI app under uvicorn.

Python's json module recurses once per level, so a 5,000-deep body raised RecursionError and
the server answered 500 with an HTML page; a body a few hundred levels deep parsed, and then
the validators and the jsonb encoder recursed on it. Every JSON the API reads (REST bodies,
the OpenAI endpoints, a program's ``default_args`` form field) is now refused past
``MAX_JSON_DEPTH`` levels with a 400 in the endpoint's error envelope."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from api.validators import MAX_JSON_DEPTH

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration, pytest.mark.timeout(120)]

DEEP = 5_000
CANARY_S = 5.0
GOOD_PROGRAM = b"def main(args):\n    return 1\n"


def _nested(depth: int) -> str:
    return '{"a": ' * depth + "1" + "}" * depth


def _canary(base: str, tenant) -> None:
    started = time.monotonic()
    response = httpx.get(f"{base}/api/v1/programs", headers={"Authorization": f"Bearer {tenant.key_secret}"})
    assert response.status_code == 200, response.text
    assert time.monotonic() - started < CANARY_S


@pytest.mark.parametrize("depth", [DEEP, MAX_JSON_DEPTH + 1, 900])
def test_deep_json_bodies_are_400s_in_the_error_envelope(api_asgi_server, api_tenant_a, api_tenant_b, depth):
    auth = {"Authorization": f"Bearer {api_tenant_a.key_secret}", "Content-Type": "application/json"}
    with httpx.Client(base_url=api_asgi_server, headers=auth, timeout=30) as client:
        rest = client.post("/api/v1/runs", content=f'{{"program": 1, "args": {_nested(depth)}}}')
        assert rest.status_code == 400, rest.text[:300]
        error = rest.json()["error"]
        assert error["code"] == "parse_error" and f"{MAX_JSON_DEPTH} levels" in error["message"]

        chat = client.post(
            "/v1/chat/completions",
            content=f'{{"model": "m", "messages": [{{"role": "user", "content": "hi"}}], "x": {_nested(depth)}}}',
        )
        assert chat.status_code == 400, chat.text[:300]
        error = chat.json()["error"]
        assert error["type"] == "invalid_request_error" and f"{MAX_JSON_DEPTH} levels" in error["message"]

        del client.headers["Content-Type"]
        upload = client.post(
            "/api/v1/programs",
            data={"name": f"deep-{depth}", "default_args": _nested(depth)},
            files={"file": ("p.py", GOOD_PROGRAM, "text/x-python")},
        )
        assert upload.status_code == 400, upload.text[:300]
        error = upload.json()["error"]
        assert error["code"] == "invalid" and f"{MAX_JSON_DEPTH} levels" in json.dumps(error["detail"]["default_args"])
    _canary(api_asgi_server, api_tenant_b)


def test_json_at_the_depth_limit_is_accepted(api_asgi_server, api_tenant_a):
    """The bound refuses only what is past it."""
    args = json.loads(_nested(MAX_JSON_DEPTH - 1))
    headers = {"Authorization": f"Bearer {api_tenant_a.key_secret}"}
    upload = httpx.post(
        f"{api_asgi_server}/api/v1/programs",
        headers=headers,
        data={"name": "at-limit", "default_args": json.dumps({"deep": args})},
        files={"file": ("p.py", GOOD_PROGRAM, "text/x-python")},
    )
    assert upload.status_code == 201, upload.text[:300]
