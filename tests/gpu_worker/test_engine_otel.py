"""The worker's OTLP export of its forwards (gpu_worker/engine_otel.py) into a collector in this
test: one ``forward`` span per record, a root span with one link per run that rode it, counts
as attributes and no tenant or account; off without ``OTEL_EXPORTER_OTLP_ENDPOINT``. The whole
stack's test is tests/integration/test_worker_otel_e2e.py."""

from __future__ import annotations

import pytest

from gpu_worker import engine_otel
from gpu_worker.engine_timeline import EngineTimeline, ForwardRecord
from gpu_worker.protocol import TraceContext
from tests.integration.otel_collector import attrs, running_collector

RUN_A = TraceContext(0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, 1)
RUN_B = TraceContext(0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, 1)


def test_off_without_an_endpoint(monkeypatch) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    assert engine_otel.from_env("w") is None


def test_each_forward_is_a_span_linked_to_every_run_that_rode_it(monkeypatch) -> None:
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    with running_collector() as collector:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url)
        exporter = engine_otel.from_env("w-1")
        assert exporter is not None
        ring = EngineTimeline(sink=exporter)
        accounts = (("acct:secret-a", 40), ("tenant:secret-b", 1))
        ring.record(ForwardRecord(1_700_000_000.25, 0.125, 3, 39, 2, 2, accounts, (RUN_A, RUN_B)))
        ring.record(ForwardRecord(1_700_000_000.5, 0.01, 1, 0, 1, 1, (("tenant:secret-b", 1),)))
        exporter.shutdown()
        found = collector.wait_for(lambda resource, span: span.name == "forward", count=2, timeout=10)
    assert len(found) == 2 and exporter.stats()["exported"] == 2 and exporter.dropped == 0
    (resource, shared), (_, alone) = sorted(found, key=lambda pair: pair[1].start_time_unix_nano)
    assert resource["service.name"] == "symphony-worker" and resource["service.instance.id"] == "w-1"
    assert shared.parent_span_id == b"" and int(shared.trace_id.hex(), 16) not in (RUN_A.trace_id, RUN_B.trace_id)
    assert {(int(link.trace_id.hex(), 16), int(link.span_id.hex(), 16)) for link in shared.links} == {
        (RUN_A.trace_id, RUN_A.span_id),
        (RUN_B.trace_id, RUN_B.span_id),
    }
    assert len(alone.links) == 0
    assert shared.start_time_unix_nano == 1_700_000_000_250_000_000
    assert shared.end_time_unix_nano - shared.start_time_unix_nano == 125_000_000
    assert attrs(shared) == {
        "symphony.worker": "w-1",
        "symphony.batch.size": 3,
        "symphony.batch.prompt_tokens": 39,
        "symphony.batch.decode_tokens": 2,
        "symphony.batch.tokens": 41,
        "symphony.batch.sessions": 2,
        "symphony.batch.accounts": 2,
    }
    assert not any(b"secret" in span.SerializeToString() for _, span in found)


def test_a_full_queue_drops_and_counts_never_blocks(monkeypatch) -> None:
    monkeypatch.setattr(engine_otel, "QUEUE_BOUND", 1)
    with running_collector() as collector:
        exporter = engine_otel.EngineSpanExporter(collector.url, "w-2")
        exporter._queue.put(None)  # the thread stops; the queue stays full
        exporter._thread.join(5)
        exporter._queue.put_nowait(ForwardRecord(1.0, 0.1, 1, 0, 1, 1, ()))
        for _ in range(3):
            exporter(ForwardRecord(1.0, 0.1, 1, 0, 1, 1, ()))
        assert exporter.dropped == 3
        exporter._provider.shutdown()


@pytest.fixture(autouse=True)
def _no_global_provider():
    """The exporter's provider is its own: nothing is set on the global tracer provider."""
    from opentelemetry import trace

    before = trace.get_tracer_provider()
    yield
    assert trace.get_tracer_provider() is before
