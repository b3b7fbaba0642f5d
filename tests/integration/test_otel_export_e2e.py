"""OpenTelemetry export of runs through the whole real stack (REST and /v1 -> uvicorn, Celery ->
gVisor sandbox -> worker on the tiny model -> PostgreSQL), into a collector in this test: a
plain HTTP server taking the OTLP/HTTP protobuf POSTs on /v1/traces, decoded with the
protocol's own messages.

A run created with a client's ``traceparent`` is exported as a child of the client's span, in
its trace, with the run's tree below it (execute, the worker session, its ``pred`` spans); a
/v1 chat request keeps its client's span too; a malformed header is ignored (the request is
answered, the run's span starts a trace of its own)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.integration.otel_collector import Collector, running_collector
from tests.integration.otel_collector import attrs as _attrs
from tests.plugins.worker import RunningWorker

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.integration,
    pytest.mark.docker,
    pytest.mark.vllm,
    pytest.mark.timeout(400),
]

LIP = b"""
import symphony as sy


def main(args):
    kv = sy.kv_create()
    first = sy.generate(kv, sy.tokenize("An exported run shows"), max_tokens=3, stop=[])
    second = sy.generate(kv, [], max_tokens=3, stop=[])
    return {"tokens": first + second}
"""

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


@pytest.fixture(scope="module")
def stack_worker(shared_stack_worker: RunningWorker) -> RunningWorker:
    return shared_stack_worker


@pytest.fixture
def collector() -> Iterator[Collector]:
    with running_collector() as server:
        yield server


@pytest.fixture
def stack_env(collector: Collector) -> dict[str, str]:
    # A short batch delay: the spans leave the executor soon after the run ends.
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.url, "OTEL_BSP_SCHEDULE_DELAY": "100"}


def _by_id(spans: list[Any]) -> dict[bytes, Any]:
    return {span.span_id: span for span in spans}


def test_a_run_is_exported_as_a_child_of_its_clients_span(stack, collector, api_tenant_a, tmp_path):
    from symphony_client import Client

    lip = tmp_path / "exported.py"
    lip.write_bytes(LIP)
    client = Client(stack, api_tenant_a.key_secret, timeout=60)
    program = client.upload_program(lip, name="exported")
    headers = {
        "Authorization": f"Bearer {api_tenant_a.key_secret}",
        "traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01",
    }
    created = httpx.post(
        f"{stack}/api/v1/runs", json={"program": program["id"], "limits": {"deadline_s": 60}}, headers=headers
    )
    assert created.status_code == 201, created.text
    run = client.wait(created.json()["id"], timeout=180)
    assert run["status"] == "succeeded", run["error"]

    resource, spans = collector.run_spans(run["id"])
    assert set(collector.paths) == {"/v1/traces"}
    assert resource["service.name"] == "symphony-control-plane" and resource["service.namespace"] == "symphony"
    ids = _by_id(spans)
    (root,) = [s for s in spans if s.name == "run"]
    # In the client's trace, below the client's span.
    assert root.trace_id.hex() == CLIENT_TRACE and root.parent_span_id.hex() == CLIENT_SPAN
    attrs = _attrs(root)
    assert attrs["symphony.tenant"] == api_tenant_a.tenant.slug and attrs["symphony.run.status"] == "succeeded"
    assert [e.name for e in root.events] == ["end"] and _attrs(root.events[0])["symphony.decode_tokens"] >= 6
    # The same tree GET /runs/<id>/trace serves, with its times.
    tree = client.run_trace(run["id"])
    assert sorted(s.name for s in spans) == sorted(s["name"] for s in tree["spans"] if s["name"] != "end")
    (execute,) = [s for s in spans if s.name == "execute"]
    (session,) = [s for s in spans if s.name == "worker.session"]
    assert execute.parent_span_id == root.span_id and ids[session.parent_span_id].name == "execute"
    preds = [s for s in spans if s.name == "pred"]
    assert len(preds) >= 2 and all(p.parent_span_id == session.span_id for p in preds)
    assert all(_attrs(p)["symphony.forwards"] >= 1 and _attrs(p)["symphony.span.kind"] == "syscall" for p in preds)
    for span in spans:
        assert root.start_time_unix_nano <= span.start_time_unix_nano <= span.end_time_unix_nano, span.name
        assert span.end_time_unix_nano <= root.end_time_unix_nano + 500_000_000, span.name
    (tree_session,) = [s for s in tree["spans"] if s["name"] == "worker.session"]
    duration = (session.end_time_unix_nano - session.start_time_unix_nano) / 1e9
    assert abs(duration - tree_session["duration_s"]) < 1e-5


def test_a_chat_request_keeps_its_clients_span_and_ignores_a_malformed_one(stack, collector, api_tenant_a):
    def chat(traceparent: str) -> str:
        answer = httpx.post(
            f"{stack}/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
            headers={"Authorization": f"Bearer {api_tenant_a.key_secret}", "traceparent": traceparent},
            timeout=120,
        )
        assert answer.status_code == 200, answer.text
        return str(uuid.UUID(answer.json()["id"].removeprefix("chatcmpl-")))

    kept = chat(f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01")
    _, spans = collector.run_spans(kept)
    (root,) = [s for s in spans if s.name == "run"]
    assert root.trace_id.hex() == CLIENT_TRACE and root.parent_span_id.hex() == CLIENT_SPAN
    assert {"execute", "worker.session", "pred"} <= {s.name for s in spans}

    # Upper-case hex, a wrong version: not the spec's form, so not kept.
    ignored = chat(f"01-{CLIENT_TRACE.upper()}-{CLIENT_SPAN}-01")
    _, spans = collector.run_spans(ignored)
    (root,) = [s for s in spans if s.name == "run"]
    assert root.parent_span_id == b"" and root.trace_id.hex() != CLIENT_TRACE
