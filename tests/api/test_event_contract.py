"""Worker and control plane agree on the Redis contracts (gpu_worker/contracts.py): every event
type the worker's publisher and the control plane write comes back, in order and equal, through
the reader the SSE and OpenAI views use; a worker's heartbeat is what routing sees. Real Redis."""

from __future__ import annotations

import asyncio
import time
import uuid
from contextlib import aclosing

from django.conf import settings

from api.models import Run
from api.services import routing
from api.services.runs import publish_end, publish_event
from api.views.run_events import stream_entries
from gpu_worker import contracts
from gpu_worker.contracts import ChannelEvent, EndEvent, KvEvent, MessageEvent, StatusEvent, TokenEvent
from gpu_worker.events import EventPublisher


async def _read_all(run_id: str) -> list[contracts.RunEvent]:
    out = []
    async with aclosing(stream_entries(run_id)) as entries:
        async for entry in entries:
            if entry.type is not None:  # a keep-alive tick
                out.append(contracts.decode(entry.type, entry.data))
    return out


def _publish_and_wait(publisher: EventPublisher, run_id: str, events: list[contracts.RunEvent]) -> None:
    before = publisher.published
    for event in events:
        publisher.publish(run_id, "tenant:contract", event)
    until = time.monotonic() + 10
    while publisher.published < before + len(events) and time.monotonic() < until:
        time.sleep(0.01)
    assert publisher.published == before + len(events), publisher.dropped


def test_every_event_the_worker_and_executor_write_decodes_with_the_api_reader(worker_heartbeats) -> None:
    run = Run(id=uuid.uuid4(), status="failed", error="deadline passed", result={"partial": "ü"})
    run_id = str(run.pk)
    worker_side = [
        TokenEvent("Grüße "),
        MessageEvent({"index": 0, "delta": "🎼"}),
        KvEvent(run_pages=6, tenant_device_pages=40, tenant_host_pages=8, tokens=512),
        ChannelEvent("votes", "send", {"agent": 1}, 11),
    ]
    publisher = EventPublisher(settings.REDIS_URL)
    try:
        publish_event(run_id, StatusEvent("running"))  # the executor took the run
        _publish_and_wait(publisher, run_id, worker_side)
        publish_end(run)  # its final status and end
        got = asyncio.run(_read_all(run_id))
    finally:
        publisher.close()
    assert got == [
        StatusEvent("running"),
        *worker_side,
        StatusEvent("failed", "deadline passed"),
        EndEvent("failed", {"partial": "ü"}),
    ]
    assert {type(e).TYPE for e in got} == set(contracts.EVENT_TYPES)  # every type, both writers


def test_a_workers_heartbeat_is_what_routing_reads(worker_heartbeats) -> None:
    publisher = EventPublisher(settings.REDIS_URL)
    try:
        publisher.heartbeat(
            "w-contract", {"name": "w-contract", "ok": True, "pages_free": 9, "pages_total": 64, "sessions": 1}
        )
        until = time.monotonic() + 10
        while not routing.live_workers() and time.monotonic() < until:
            time.sleep(0.02)
    finally:
        publisher.close()
    (worker,) = routing.live_workers()
    assert (worker.name, worker.ok, worker.pages_free, worker.pages_total, worker.sessions) == (
        "w-contract",
        True,
        9,
        64,
        1,
    )
