"""The Python client's event stream against scripted HTTP answers (the real server's side is in
tests/api/test_client_cli.py): a server that cannot be reached is said at once, as every other
call says it; only a stream that had been open is resumed, a bounded number of times."""

from __future__ import annotations

import httpx
import pytest

from symphony_client import Client, StreamLost
from symphony_client import client as client_module
from symphony_client.output import plural, run_title


@pytest.fixture
def sleeps(monkeypatch) -> list[float]:
    slept: list[float] = []
    monkeypatch.setattr(client_module.time, "sleep", slept.append)
    return slept


def _client(answers: list[httpx.Response | Exception], seen: list[httpx.Request]) -> Client:
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        answer = answers.pop(0) if answers else httpx.ConnectError("refused", request=request)
        if isinstance(answer, Exception):
            raise answer
        return answer

    return Client("http://api.test", "sk_x_y", transport=httpx.MockTransport(handle))


def test_an_unreachable_server_is_raised_at_once(sleeps):
    seen: list[httpx.Request] = []
    with pytest.raises(httpx.ConnectError):
        list(_client([], seen).events("r1"))
    assert (len(seen), sleeps) == (1, [])


def test_a_stream_that_was_open_is_resumed_a_bounded_number_of_times(sleeps):
    body = b'id: 1-0\nevent: token\ndata: {"text": "Hi"}\n\n'  # then the server goes away
    seen: list[httpx.Request] = []
    got = []
    with pytest.raises(StreamLost) as lost:
        for event in _client([httpx.Response(200, content=body)], seen).events("r1"):
            got.append(event.data)
    assert got == [{"text": "Hi"}]
    assert sleeps == [1.0, 2.0, 4.0, 8.0, 8.0] and len(seen) == 6
    assert all(request.headers["Last-Event-ID"] == "1-0" for request in seen[1:])
    assert lost.value.message == "the events stream of run r1 broke off and 5 reconnections over 23 s failed"


def test_counts_agree_with_their_nouns_and_a_run_is_named_by_its_program_and_first_argument():
    assert [plural(n, "event") for n in (0, 1, 2)] == ["0 events", "1 event", "2 events"]
    assert plural(1, "child", "children") == "1 child" and plural(3, "child", "children") == "3 children"
    run = {"program_name": "completion", "args": {"prompt": "What is the capital of France?", "n": 2}}
    assert run_title(run) == 'completion prompt="What is the capital of France?"'
    assert run_title({"program": 7, "args": {}, "entry": "tools:search"}) == "program 7 tools:search"
    assert run_title({"program_name": "sum", "args": {"xs": [1, 2]}}) == "sum xs=[1, 2]"
