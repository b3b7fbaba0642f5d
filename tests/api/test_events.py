"""SSE over a real ASGI server (uvicorn subprocess): events from the Redis stream in order, resume
with Last-Event-ID, the stream ends after ``end``, and another tenant gets 404. A finished run is
replayed without waiting and answered from its row once its stream has expired; a client that
already had the ``end`` gets 204; a bad Last-Event-ID is a 400 and a key without the ``runs``
scope a 403, before anything is streamed."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest
import redis
from django.conf import settings

from api.models import Program, Run
from api.services import programs
from api.services.keys import issue_key
from api.services.runs import RunOutcome, create_run, finish_run, publish_event
from gpu_worker.contracts import EndEvent, TokenEvent

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration]


def _open(url: str, secret: str, last_id: str | None = None):
    headers = {"Authorization": f"Bearer {secret}"}
    if last_id:
        headers["Last-Event-ID"] = last_id
    return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=20)


def _get(url: str, secret: str, last_id: str | None = None) -> str:
    with _open(url, secret, last_id) as response:
        return response.read().decode()


def _events(body: str) -> list[dict]:
    """The SSE blocks of ``body`` as ``{"id", "event", "data"}`` (keep-alive comments dropped)."""
    out = []
    for block in body.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if not line.startswith(":"))
        if fields:
            out.append({"id": fields.get("id"), "event": fields["event"], "data": json.loads(fields["data"])})
    return out


def _http_error(url: str, secret: str, last_id: str | None = None) -> tuple[int, dict]:
    with pytest.raises(urllib.error.HTTPError) as err:
        _get(url, secret, last_id)
    return err.value.code, json.loads(err.value.read())


@pytest.fixture
def run_of_a(api_tenant_a) -> Run:
    prog = Program.objects.create(tenant=api_tenant_a.tenant, name="p")
    programs.add_version(prog, "p.py", b"def main(a):\n    return 1\n")
    return create_run(api_tenant_a.tenant, prog, None, {}, {})[0]


def test_sse_streams_resumes_and_is_tenant_scoped(api_asgi_server, api_tenant_a, api_tenant_b):
    prog = Program.objects.create(tenant=api_tenant_a.tenant, name="p")
    programs.add_version(prog, "p.py", b"def main(a):\n    return 1\n")
    run, _ = create_run(api_tenant_a.tenant, prog, None, {}, {})
    publish_event(str(run.pk), TokenEvent("Hel"))
    publish_event(str(run.pk), TokenEvent("lo"))
    publish_event(str(run.pk), EndEvent("succeeded"))
    url = f"{api_asgi_server}/api/v1/runs/{run.pk}/events"
    body = _get(url, api_tenant_a.key_secret)
    events = [block for block in body.split("\n\n") if block.startswith("id:")]
    assert [e.splitlines()[1] for e in events] == ["event: token", "event: token", "event: end"]
    assert 'data: {"text": "Hel"}' in events[0]
    first_id = events[0].splitlines()[0].removeprefix("id: ")
    resumed = _get(url, api_tenant_a.key_secret, last_id=first_id)
    assert "Hel" not in resumed and "lo" in resumed and "event: end" in resumed
    with pytest.raises(urllib.error.HTTPError) as err:
        _get(url, api_tenant_b.key_secret)
    assert err.value.code == 404


def test_a_finished_run_replays_at_once_then_204_and_its_stream_expires(api_asgi_server, api_tenant_a, run_of_a):
    publish_event(str(run_of_a.pk), TokenEvent("Hi"))
    finish_run(str(run_of_a.pk), RunOutcome(status="succeeded", result={"answer": 42}))
    key = f"run:{run_of_a.pk}"
    ttl = redis.Redis.from_url(settings.REDIS_URL).ttl(key)
    assert 0 < ttl <= settings.SYMPHONY_RUN_EVENTS_RETENTION_S

    url = f"{api_asgi_server}/api/v1/runs/{run_of_a.pk}/events"
    events = _events(_get(url, api_tenant_a.key_secret))  # returns: nothing is waited for
    assert [e["event"] for e in events] == ["token", "status", "end"]
    assert events[-1]["data"] == {"status": "succeeded", "result": {"answer": 42}}
    # Resuming in the middle replays the rest; resuming after the end is a 204 (EventSource stops).
    assert [e["event"] for e in _events(_get(url, api_tenant_a.key_secret, events[0]["id"]))] == ["status", "end"]
    with _open(url, api_tenant_a.key_secret, events[-1]["id"]) as response:
        assert response.status == 204 and response.read() == b""

    # The Python client reads the same streams: the whole replay, and nothing (no retries) after the end.
    from symphony_client import Client

    client = Client(api_asgi_server, api_tenant_a.key_secret)
    assert [e.type for e in client.events(str(run_of_a.pk))] == ["token", "status", "end"]
    started = time.monotonic()
    assert list(client.events(str(run_of_a.pk), last_event_id=events[-1]["id"])) == []
    assert time.monotonic() - started < 5  # answered, not retried with back-off


def test_a_finished_run_whose_stream_is_gone_is_answered_from_its_row(api_asgi_server, api_tenant_a, run_of_a):
    finish_run(str(run_of_a.pk), RunOutcome(status="failed", error="boom"))
    redis.Redis.from_url(settings.REDIS_URL).delete(f"run:{run_of_a.pk}")  # what expiry does
    url = f"{api_asgi_server}/api/v1/runs/{run_of_a.pk}/events"
    for last_id in (None, "1700000000000-3"):  # a fresh client, and one resuming an expired stream
        events = _events(_get(url, api_tenant_a.key_secret, last_id))
        assert [(e["event"], e["id"]) for e in events] == [("status", None), ("end", None)]
        assert events[0]["data"] == {"status": "failed", "error": "boom"}


def test_a_run_marked_finished_before_its_end_event_still_closes(api_asgi_server, api_tenant_a, run_of_a):
    """The row can be terminal a moment before the executor's ``end`` reaches Redis: the client
    gets what the stream has, then the closing events from the row, instead of waiting."""
    publish_event(str(run_of_a.pk), TokenEvent("a"))
    Run.objects.filter(pk=run_of_a.pk).update(status="succeeded", result=7)
    events = _events(_get(f"{api_asgi_server}/api/v1/runs/{run_of_a.pk}/events", api_tenant_a.key_secret))
    assert [e["event"] for e in events] == ["token", "status", "end"]
    assert events[-1]["data"]["result"] == 7


def test_bad_last_event_ids_and_keys_without_the_runs_scope_are_refused(api_asgi_server, api_tenant_a, run_of_a):
    url = f"{api_asgi_server}/api/v1/runs/{run_of_a.pk}/events"
    for bad in ("abc", "1-2-3", "-1", "18446744073709551616-0", "1-" + "9" * 25, "1.5"):
        status, body = _http_error(url, api_tenant_a.key_secret, bad)
        assert (status, body["error"]["code"]) == (400, "invalid"), bad
    no_runs = issue_key(api_tenant_a.tenant, "programs only", ["programs"]).secret
    status, body = _http_error(url, no_runs)
    assert (status, body["error"]["code"]) == (403, "permission_denied")
    status, body = _http_error(url, "sk_nope_" + "x" * 40)
    assert (status, body["error"]["code"]) == (401, "authentication_failed")
