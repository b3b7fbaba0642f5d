"""A run's trace through the whole real stack (REST -> Celery -> gVisor sandbox -> worker on the
tiny model -> PostgreSQL): a LIP that makes ``pred`` calls, sleeps (a brokered I/O wait) and
makes more; its trace shows each call with its queue wait and the forward it rode in, the
sleep with its length, the sandbox start and the run's phases in order, in JSON, in the Chrome
format and in ``symphony trace``; another tenant gets a 404."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT
from tests.plugins.worker import RunningWorker, start_worker

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.integration,
    pytest.mark.docker,
    pytest.mark.vllm,
]

LIP = b"""
import symphony as sy


def main(args):
    kv = sy.kv_create()
    first = sy.generate(kv, sy.tokenize("The trace of a run shows"), max_tokens=3, stop=[])
    sy.sleep(0.4)
    second = sy.generate(kv, [], max_tokens=3, stop=[])
    return {"tokens": first + second}
"""


@pytest.fixture(scope="module")
def stack_worker(tiny_model_dir: Path) -> Iterator[RunningWorker]:
    with start_worker(tiny_model_dir, name="traces") as worker:
        yield worker


def test_a_runs_trace_shows_its_calls_its_sleep_and_its_phases(stack, api_tenant_a, api_tenant_b, tmp_path):
    from symphony_client import Client

    lip = tmp_path / "traced.py"
    lip.write_bytes(LIP)
    client = Client(stack, api_tenant_a.key_secret, timeout=60)
    program = client.upload_program(lip, name="traced")
    run = client.wait(client.create_run(program["id"], limits={"deadline_s": 60})["id"], timeout=180)
    assert run["status"] == "succeeded", run["error"]

    trace = client.run_trace(run["id"])
    assert trace["complete"] and trace["dropped"] == 0
    spans, ids = trace["spans"], {s["id"]: s for s in trace["spans"]}
    named = {}
    for span in spans:
        named.setdefault(span["name"], []).append(span)
    root = named["run"][0]
    assert root["parent"] is None and root["start_s"] == 0
    queued, execute = named["queued"][0], named["execute"][0]
    assert queued["attrs"]["worker"] == "traces" and queued["end_s"] <= execute["start_s"] + 0.05
    start = named["sandbox.start"][0]
    assert isinstance(start["attrs"]["warm"], bool) and start["parent"] == execute["id"]
    session = named["worker.session"][0]
    assert ids[session["parent"]]["name"] == "execute"

    # Every pred: queued, then rode at least one forward; the batch counts are sane.
    preds = named["pred"]
    assert len(preds) >= 2 and all(p["parent"] == session["id"] for p in preds)
    for p in preds:
        a = p["attrs"]
        assert 0 <= a["queue_wait_s"] <= p["duration_s"] + 1e-6
        assert a["forwards"] >= 1 and a["batch_size"] >= 1 and a["batch_tokens"] >= a["tokens"] >= 1
        assert 0 < a["forward_share_s"] <= a["forward_s"] + 1e-9
    # The sleep: a brokered I/O wait of its length, between the two generations.
    (sleep,) = named["sleep"]
    assert sleep["kind"] == "io" and 0.38 <= sleep["duration_s"] < 3
    assert min(p["start_s"] for p in preds) < sleep["start_s"] < max(p["end_s"] for p in preds)
    # The worker's spans fall within the run (its clock and the executor's are the host's).
    slack = 0.5
    for span in spans:
        assert -slack <= span["start_s"] <= span["end_s"] <= root["end_s"] + slack, span
    end = named["end"][0]
    assert end["attrs"]["status"] == "succeeded" and end["attrs"]["decode_tokens"] >= 6

    # Chrome trace events, as Perfetto opens them.
    chrome = client.run_trace_chrome(run["id"])
    phases = {(e["name"], e["ph"]) for e in chrome["traceEvents"]}
    assert {("run", "X"), ("execute", "X"), ("pred", "b"), ("pred", "e"), ("sleep", "b")} <= phases

    # The CLI's summary: where the time went and the top spans (the sleep among them).
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYMPHONY_")}
    env.update(PYTHONPATH=str(ROOT / "client"), SYMPHONY_CONFIG=str(tmp_path / "cli.json"))
    flags = ["--url", stack, "--api-key", api_tenant_a.key_secret]
    shown = subprocess.run(
        [sys.executable, "-m", "symphony_client", "trace", run["id"], "--human", *flags],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].startswith(f"run {run['id']} succeeded")
    top = lines[lines.index("top 5 spans:") + 1 :]
    assert len(top) == 5 and any(line.split()[1] == "sleep" for line in top)
    assert any(line.split()[0] == "io" for line in lines if line.startswith("  "))
    as_chrome = subprocess.run(
        [sys.executable, "-m", "symphony_client", "trace", run["id"], "--chrome", *flags],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert as_chrome.returncode == 0 and "traceEvents" in json.loads(as_chrome.stdout)

    # Another tenant: as for the run itself, a 404 in the error envelope.
    other = httpx.get(
        f"{stack}/api/v1/runs/{run['id']}/trace", headers={"Authorization": f"Bearer {api_tenant_b.key_secret}"}
    )
    assert other.status_code == 404 and other.json()["error"]["code"] == "not_found"


TREE = b"""
import symphony as sy


def waiter(args):
    sy.channel("ready").send(1)
    return sy.channel("go").recv(timeout=60)


def main(args):
    child = sy.spawn("self:waiter", {})
    sy.channel("ready").recv(timeout=60)
    sy.sleep(1.0)
    sy.channel("go").send("now")
    return {"child": child.id, "got": child.wait(timeout=60)}
"""


def test_a_child_waiting_on_a_channel_is_recognisable_from_the_traces(stack, api_tenant_a, tmp_path):
    """The parent's trace shows its child as a span and its own wait for it; the child's trace
    shows where its time went: a ``channel_recv`` wait of the second its parent slept."""
    from symphony_client import Client

    lip = tmp_path / "tree.py"
    lip.write_bytes(TREE)
    client = Client(stack, api_tenant_a.key_secret, timeout=60)
    program = client.upload_program(lip, name="tree")
    run = client.wait(client.create_run(program["id"], limits={"deadline_s": 90})["id"], timeout=180)
    assert run["status"] == "succeeded", run["error"]
    child_id = run["result"]["child"]
    assert run["result"]["got"] == "now"

    parent = client.run_trace(run["id"])
    (child_span,) = [s for s in parent["spans"] if s["kind"] == "child"]
    assert child_span["attrs"]["run"] == child_id and child_span["attrs"]["status"] == "succeeded"
    assert [s for s in parent["spans"] if s["name"] == "child_wait" and s["kind"] == "wait"]

    child = client.run_trace(child_id)
    ops = [s for s in child["spans"] if s["kind"] in ("syscall", "io", "wait", "kv_move")]
    slowest = max(ops, key=lambda s: s["duration_s"])
    assert (slowest["name"], slowest["kind"]) == ("channel_recv", "wait"), ops
    assert 0.9 <= slowest["duration_s"] < 10, slowest
