"""Channels through the whole stack: runs created over the API, executed by Celery in gVisor
on a real worker. The executor makes each run the root of its own tree (``tree`` = its id, until
spawn gives children their root's), so a run reads its own channel messages, a concurrent run
of the same tenant reads none of them, and what a run sent is on its event stream (SSE) as
``channel`` events."""

from __future__ import annotations

import pytest

from tests.plugins.worker import RunningWorker

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.integration,
    pytest.mark.docker,
    pytest.mark.vllm,
]

SENDER = b"""
import time
import symphony as sy

def main(args):
    inbox = sy.channel("inbox")
    inbox.send({"note": "for my own tree"})
    back = inbox.recv_message(timeout=10)
    reached = sy.channel("news").publish("nobody subscribed")
    inbox.send("left queued while a run of another tree looks")
    time.sleep(args["hold_s"])
    return {"back": back.data, "sender": back.sender, "reached": reached}
"""

READER = b"""
import symphony as sy

def main(args):
    try:
        return {"read": sy.channel("inbox").recv(timeout=args["wait_s"])}
    except sy.ChannelTimeout as exc:
        return {"read": None, "error": exc.reason}
"""


@pytest.fixture(scope="module")
def stack_worker(shared_stack_worker: RunningWorker) -> RunningWorker:
    return shared_stack_worker


@pytest.fixture
def stack_concurrency() -> int | None:
    return 2  # the two runs at once


def test_runs_own_channels_are_theirs_and_their_sends_are_events(stack, api_tenant_a, tmp_path) -> None:
    from symphony_client import Client

    client = Client(stack, api_tenant_a.key_secret, timeout=60)
    (tmp_path / "sender.py").write_bytes(SENDER)
    (tmp_path / "reader.py").write_bytes(READER)
    sender = client.upload_program(tmp_path / "sender.py", name="channel-sender")
    reader = client.upload_program(tmp_path / "reader.py", name="channel-reader")
    a = client.create_run(sender["id"], args={"hold_s": 6}, limits={"deadline_s": 120})
    b = client.create_run(reader["id"], args={"wait_s": 4}, limits={"deadline_s": 120})

    events = list(client.events(a["id"]))
    assert events[-1].type == "end", [e.type for e in events]
    done_a, done_b = client.wait(a["id"], timeout=60), client.wait(b["id"], timeout=60)
    assert done_a["status"] == "succeeded", done_a["error"]
    assert done_a["result"] == {"back": {"note": "for my own tree"}, "sender": a["id"], "reached": 0}
    assert done_b["status"] == "succeeded", done_b["error"]
    assert done_b["result"] == {"read": None, "error": "channel_timeout"}

    sent = [e.data for e in events if e.type == "channel"]
    assert sent == [
        {"channel": "inbox", "op": "send", "data": {"note": "for my own tree"}, "bytes": 26},
        {"channel": "news", "op": "publish", "data": "nobody subscribed", "bytes": 19},
        {"channel": "inbox", "op": "send", "data": "left queued while a run of another tree looks", "bytes": 47},
    ]
