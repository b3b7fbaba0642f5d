"""The worker's own OpenTelemetry export through the whole real stack (REST -> Celery ->
gVisor sandbox -> a worker on the tiny model started with ``OTEL_EXPORTER_OTLP_ENDPOINT``),
into a collector in this test (tests/integration/otel_collector.py).

The control plane tells the worker the run's trace context at ``create_session``; each
forward the run's session rode is a ``forward`` span of the service ``symphony-worker``,
linked (not parented: a forward serves several runs) to the run's span, whose ids the control
plane's own export then gives the run span: the client's trace when it sent a ``traceparent``,
else a trace whose id is the run's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.otel_collector import Collector, attrs, running_collector
from tests.plugins.worker import RunningWorker, start_worker

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.integration,
    pytest.mark.docker,
    pytest.mark.vllm,
    pytest.mark.timeout(600),
]

LIP = b"""
import symphony as sy


def main(args):
    kv = sy.kv_create()
    first = sy.generate(kv, sy.tokenize("A forward the worker exported"), max_tokens=3, stop=[])
    second = sy.generate(kv, [], max_tokens=3, stop=[])
    return {"tokens": first + second}
"""

CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"


@pytest.fixture(scope="module")
def collector() -> Iterator[Collector]:
    with running_collector() as server:
        yield server


@pytest.fixture(scope="module")
def stack_worker(tiny_model_dir: Path, collector: Collector) -> Iterator[RunningWorker]:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.url, "OTEL_BSP_SCHEDULE_DELAY": "100"}
    with start_worker(tiny_model_dir, name="otel-worker", env=env) as worker:
        yield worker


@pytest.fixture
def stack_env(collector: Collector) -> dict[str, str]:
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.url, "OTEL_BSP_SCHEDULE_DELAY": "100"}


def _run(stack, api_tenant_a, program_id: str, headers: dict[str, str]) -> dict[str, Any]:
    from symphony_client import Client

    client = Client(stack, api_tenant_a.key_secret, timeout=60)
    created = httpx.post(
        f"{stack}/api/v1/runs",
        json={"program": program_id, "limits": {"deadline_s": 60}},
        headers={"Authorization": f"Bearer {api_tenant_a.key_secret}", **headers},
    )
    assert created.status_code == 201, created.text
    run = client.wait(created.json()["id"], timeout=180)
    assert run["status"] == "succeeded", run["error"]
    return run


def _linked_forwards(collector: Collector, root: Any) -> list[tuple[dict[str, Any], Any]]:
    """The worker's forward spans with a link to the run span ``root``."""

    def linked(resource: dict[str, Any], span: Any) -> bool:
        return span.name == "forward" and any(
            link.trace_id == root.trace_id and link.span_id == root.span_id for link in span.links
        )

    # A run's forwards: its two prompts' and their decode steps' (at least three).
    return collector.wait_for(linked, count=3)


def test_the_workers_forwards_link_to_the_run_the_client_traced(stack, collector, api_tenant_a, tmp_path):
    from symphony_client import Client

    lip = tmp_path / "linked.py"
    lip.write_bytes(LIP)
    program = Client(stack, api_tenant_a.key_secret, timeout=60).upload_program(lip, name="linked")
    run = _run(stack, api_tenant_a, program["id"], {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"})

    _, spans = collector.run_spans(run["id"])
    (root,) = [s for s in spans if s.name == "run"]
    assert root.trace_id.hex() == CLIENT_TRACE and root.parent_span_id.hex() == CLIENT_SPAN

    forwards = _linked_forwards(collector, root)
    assert len(forwards) >= 3, f"{len(forwards)} linked forwards of {len(collector.spans)} spans"
    for resource, span in forwards:
        assert resource["service.name"] == "symphony-worker" and resource["service.namespace"] == "symphony"
        assert resource["service.instance.id"] == "otel-worker"
        # Linked, not parented: a forward is a root span of a trace of its own.
        assert span.parent_span_id == b"" and span.trace_id.hex() != CLIENT_TRACE
        a = attrs(span)
        assert a["symphony.batch.size"] >= 1 and a["symphony.batch.sessions"] >= 1
        assert a["symphony.batch.accounts"] >= 1 and a["symphony.worker"] == "otel-worker"
        assert a["symphony.batch.tokens"] == a["symphony.batch.prompt_tokens"] + a["symphony.batch.decode_tokens"]
        # Within the run (the run span ends after its worker session did).
        assert root.start_time_unix_nano <= span.start_time_unix_nano <= span.end_time_unix_nano
        assert span.end_time_unix_nano <= root.end_time_unix_nano
        assert not any(key.startswith("symphony.tenant") for key in a), "no tenant names leave the worker"
    assert sum(attrs(s)["symphony.batch.prompt_tokens"] for _, s in forwards) >= 4
    assert sum(attrs(s)["symphony.batch.decode_tokens"] for _, s in forwards) >= 2

    # A run with no traceparent: its span starts a trace whose id is the run's, linked the same way.
    untraced = _run(stack, api_tenant_a, program["id"], {})
    _, spans = collector.run_spans(untraced["id"])
    (root,) = [s for s in spans if s.name == "run"]
    assert root.trace_id.hex() == untraced["id"].replace("-", "") and root.parent_span_id == b""
    assert len(_linked_forwards(collector, root)) >= 3
