"""The Python client's handling of the tenant request rate, against scripted HTTP answers (the
server's side, the 429 itself, is tested through the real app in tests/api/test_tenant_rate.py and
tests/api/test_client_cli.py): a ``throttled`` 429 is resent after its Retry-After while the
call's wait budget lasts; a ``quota_exceeded`` 429 (a plan limit) is raised at once."""

from __future__ import annotations

import json

import httpx
import pytest

from symphony_client import ApiError, Client
from symphony_client import client as client_module


def _error(status: int, code: str, retry_after: str | None = None) -> httpx.Response:
    headers = {"Retry-After": retry_after} if retry_after is not None else {}
    return httpx.Response(status, json={"error": {"code": code, "message": code, "detail": None}}, headers=headers)


@pytest.fixture
def sleeps(monkeypatch) -> list[float]:
    slept: list[float] = []
    monkeypatch.setattr(client_module.time, "sleep", slept.append)
    return slept


def _client(answers: list[httpx.Response], seen: list[httpx.Request], **kwargs) -> Client:
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return answers.pop(0)

    return Client("http://api.test", "sk_x_y", transport=httpx.MockTransport(handle), **kwargs)


def test_a_throttled_call_is_resent_after_retry_after(sleeps):
    seen: list[httpx.Request] = []
    answers = [_error(429, "throttled", "3"), _error(429, "throttled", "2"), httpx.Response(201, json={"id": "r1"})]
    run = _client(answers, seen).create_run(7, args={"x": 1}, idempotency_key="k")
    assert run == {"id": "r1"} and sleeps == [3.0, 2.0]
    assert len(seen) == 3 and all(json.loads(r.content)["args"] == {"x": 1} for r in seen)
    assert {r.headers["Idempotency-Key"] for r in seen} == {"k"}


def test_the_wait_budget_bounds_the_resending(sleeps):
    seen: list[httpx.Request] = []
    answers = [_error(429, "throttled", "40"), _error(429, "throttled", "30")]
    with pytest.raises(ApiError) as refused:
        _client(answers, seen, throttle_wait_s=60).get_run("r1")
    assert (refused.value.status, refused.value.code) == (429, "throttled")
    assert sleeps == [40.0] and len(seen) == 2  # 40 + 30 would pass the 60 s budget

    with pytest.raises(ApiError):
        _client([_error(429, "throttled", "1")], [], throttle_wait_s=0).quota()
    assert sleeps == [40.0]


def test_a_plan_limit_or_a_429_without_retry_after_is_raised_at_once(sleeps):
    for answer in (_error(429, "quota_exceeded", "5"), _error(429, "throttled")):
        with pytest.raises(ApiError) as refused:
            _client([answer], []).create_run(7)
        assert refused.value.status == 429
    assert sleeps == []


def test_a_throttled_event_stream_waits_and_resumes(sleeps):
    body = b'id: 1-0\nevent: token\ndata: {"text": "Hi"}\n\nid: 2-0\nevent: end\ndata: {}\n\n'
    seen: list[httpx.Request] = []
    answers = [_error(429, "throttled", "4"), httpx.Response(200, content=body)]
    events = list(_client(answers, seen).events("r1"))
    assert [(e.type, e.data) for e in events] == [("token", {"text": "Hi"}), ("end", {})] and sleeps == [4.0]
