"""SSE over a real ASGI server (uvicorn subprocess): events from the Redis stream in order, resume
with Last-Event-ID, the stream ends after ``end``, and another tenant gets 404."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest

from api.models import Program
from api.services import programs
from api.services.runs import create_run, publish_event

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration]


def _get(url: str, secret: str, last_id: str | None = None) -> str:
    headers = {"Authorization": f"Bearer {secret}"}
    if last_id:
        headers["Last-Event-ID"] = last_id
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=20) as response:
        return response.read().decode()


def test_sse_streams_resumes_and_is_tenant_scoped(api_asgi_server, api_tenant_a, api_tenant_b):
    prog = Program.objects.create(tenant=api_tenant_a.tenant, name="p")
    programs.add_version(prog, "p.py", b"def main(a):\n    return 1\n")
    run, _ = create_run(api_tenant_a.tenant, prog, None, {}, {})
    publish_event(str(run.pk), "token", {"text": "Hel"})
    publish_event(str(run.pk), "token", {"text": "lo"})
    publish_event(str(run.pk), "end", {"status": "succeeded"})
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
