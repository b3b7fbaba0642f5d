"""The cross-process contracts (gpu_worker/contracts.py) without Redis: every run event encodes
to the entry its readers expect and decodes back to itself; entries that are not an event are
refused; heartbeats round-trip."""

from __future__ import annotations

import json

import pytest

from gpu_worker import contracts
from gpu_worker.contracts import ChannelEvent, EndEvent, KvEvent, MessageEvent, StatusEvent, TokenEvent

EVERY_EVENT = [
    TokenEvent("Grüße 🎼"),
    MessageEvent({"index": 1, "delta": "é", "nested": [1, None, True]}),
    MessageEvent(7),
    KvEvent(run_pages=6, tenant_device_pages=40, tenant_host_pages=8, tokens=512),
    StatusEvent("running"),
    StatusEvent("failed", "deadline passed"),
    EndEvent("succeeded", {"answer": 42}),
    EndEvent("cancelled"),
    ChannelEvent("votes", "send", {"agent": 2, "say": "ja"}, 24),
    ChannelEvent("news", "publish", ["ü"], 6),
]


def test_the_event_types_are_the_classes() -> None:
    assert contracts.EVENT_TYPES == ("token", "message", "kv", "status", "end", "channel")
    assert {type(e).TYPE for e in EVERY_EVENT} == set(contracts.EVENT_TYPES)


@pytest.mark.parametrize("event", EVERY_EVENT, ids=lambda e: type(e).TYPE)
def test_every_event_round_trips(event: contracts.RunEvent) -> None:
    type_, data = contracts.encode(event)
    assert type_ == type(event).TYPE
    assert contracts.decode(type_, data) == event
    assert contracts.decode(type_, data.encode()) == event  # as bytes, the way Redis returns it
    fields = {k.encode(): v.encode() for k, v in contracts.entry(event).items()}
    assert contracts.entry_strings(fields) == (type_, data)


def test_the_stored_json_is_what_readers_parse() -> None:
    """The shapes the console, the Python client and OpenAI streaming read (SSE passes data through)."""
    assert json.loads(contracts.encode(TokenEvent("hi"))[1]) == {"text": "hi"}
    assert json.loads(contracts.encode(StatusEvent("running"))[1]) == {"status": "running"}
    assert json.loads(contracts.encode(StatusEvent("failed", ""))[1]) == {"status": "failed", "error": ""}
    assert json.loads(contracts.encode(EndEvent("succeeded"))[1]) == {"status": "succeeded", "result": None}
    _, data = contracts.encode(TokenEvent("é"))
    assert "é" in data and contracts.entry_bytes("token", data) == len("token") + len(data.encode())


@pytest.mark.parametrize(
    ("type_", "data", "error"),
    [
        ("tokens", '{"text": "x"}', "unknown run event type"),
        ("token", "{not json", "not JSON"),
        ("token", '["x"]', "JSON object"),
        ("kv", '{"tokens": 1}', "do not fit"),
        ("end", '{"status": "succeeded", "extra": 1}', "do not fit"),
    ],
)
def test_an_entry_that_is_no_event_is_refused(type_: str, data: str, error: str) -> None:
    with pytest.raises(contracts.EventDecodeError, match=error):
        contracts.decode(type_, data)


def test_an_entry_without_its_fields_reads_as_an_empty_message() -> None:
    assert contracts.entry_strings({}) == ("message", "{}")


def test_keys() -> None:
    assert contracts.run_stream_key("abc") == "run:abc"
    assert contracts.run_id_of(b"run:abc") == "abc"
    assert contracts.heartbeat_key("w0") == "symphony:worker:w0"


def test_a_heartbeat_round_trips() -> None:
    health = {"name": "w0", "ok": True, "pages_free": 10, "pages_total": 64, "sessions": 2, "metrics": {"forwards": 3}}
    beat = contracts.decode_heartbeat(contracts.encode_heartbeat(health))
    assert (beat.name, beat.ok, beat.pages_free, beat.pages_total, beat.sessions) == ("w0", True, 10, 64, 2)
    assert beat.health == health
    sparse = contracts.decode_heartbeat(json.dumps({"name": "w1"}))
    assert (sparse.ok, sparse.pages_free, sparse.sessions) == (False, 0, 0)
    with pytest.raises(ValueError, match="names its worker"):
        contracts.encode_heartbeat({"ok": True})
