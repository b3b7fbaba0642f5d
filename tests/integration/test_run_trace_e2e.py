"""A run's trace through the whole real stack (REST -> Celery -> gVisor sandbox -> worker on the
tiny model -> PostgreSQL): a LIP that makes ``pred`` calls, sleeps (a brokered I/O wait) and
makes more; its trace shows each call with its queue wait and the forward it rode in, the
sleep with its length, the sandbox start and the run's phases in order, in JSON, in the Chrome
format and in ``symphony trace``; another tenant gets a 404.

Then slow runs that the trace alone makes recognisable (its longest span is the cause, and its
attributes name it): a pred that rode another tenant's long prefill, a cold sandbox start, and
a KV file read back from the store."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
    # Room for a ~3,000-token prompt (the slow-run tests below).
    with start_worker(tiny_model_dir, name="traces", extra_args=["--max-model-len", "4096"]) as worker:
        yield worker


@pytest.fixture
def stack_concurrency() -> int:
    """Two runs at once: one test runs two tenants side by side."""
    return 2


#: Span kinds and names that contain others (as ``symphony trace`` counts them): the rest are
#: where the time went.
CONTAINER_KINDS = frozenset({"run", "worker"})
CONTAINER_NAMES = frozenset({"execute", "sandbox.run", "program.run"})
#: The worker's own spans of a session.
WORKER_KINDS = frozenset({"syscall", "io", "wait", "kv_move"})


def slowest(spans: list[dict[str, Any]], kinds: frozenset[str] | None = None) -> dict[str, Any]:
    """The longest span that contains no others (of ``kinds`` if given)."""
    leaves = [
        s
        for s in spans
        if s["kind"] not in CONTAINER_KINDS
        and s["name"] not in CONTAINER_NAMES
        and (kinds is None or s["kind"] in kinds)
    ]
    return max(leaves, key=lambda s: s["duration_s"])


def run_lip(client: Any, tmp_path: Path, source: bytes, name: str, args: dict | None = None) -> str:
    lip = tmp_path / f"{name}.py"
    lip.write_bytes(source)
    program = client.upload_program(lip, name=name)
    return client.create_run(program["id"], args or {}, limits={"deadline_s": 60})["id"]


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


PREFILLER = b"""
import symphony as sy


def main(args):
    # A ~3,000-token prompt, another each round (a new first token: no prefix-cache hit).
    for n in range(args["rounds"]):
        kv = sy.kv_create()
        sy.pred_token(kv, [1000 + n] + [200 + (7 * i) % 5000 for i in range(2999)])
        kv.close()
    return {"rounds": args["rounds"]}
"""

SHORT = b"""
import symphony as sy


def main(args):
    kv = sy.kv_create()
    return {"tokens": sy.generate(kv, sy.tokenize("A short question"), max_tokens=4, stop=[])}
"""


def test_a_pred_behind_another_tenants_long_prefill_is_recognisable(
    stack, stack_worker, api_tenant_a, api_tenant_b, tmp_path
):
    """Tenant B prefills ~3,000-token prompts while tenant A's short run decodes: A's slowest
    span is its ``pred``, and its batches' tokens were mostly B's (``own_tokens`` of
    ``batch_tokens``), never naming B."""
    from api.models import Plan
    from symphony_client import ApiError, Client

    # B's rounds are ~3,000 tokens each: past the default plan's tokens per run.
    Plan.objects.create(name="prefiller", max_tokens_per_run=1_000_000, max_run_seconds=120)
    api_tenant_b.tenant.plan = "prefiller"
    api_tenant_b.tenant.save(update_fields=["plan"])
    a = Client(stack, api_tenant_a.key_secret, timeout=60)
    b = Client(stack, api_tenant_b.key_secret, timeout=60)
    slug_b = api_tenant_b.tenant.slug
    before = stack_worker.admin.health()["metrics"]["served_per_tenant"].get(slug_b, 0.0)
    busy = run_lip(b, tmp_path, PREFILLER, "prefiller", {"rounds": 200})
    try:
        # A starts once B's prefills are being served (the worker's own counters say so).
        deadline = time.monotonic() + 40
        while stack_worker.admin.health()["metrics"]["served_per_tenant"].get(slug_b, 0.0) < before + 3000:
            assert time.monotonic() < deadline, "tenant B's prefill never started"
            assert b.get_run(busy)["status"] in ("queued", "running"), b.get_run(busy)
            time.sleep(0.2)
        short = a.wait(run_lip(a, tmp_path, SHORT, "short"), timeout=60)
        assert short["status"] == "succeeded", short["error"]
        still = b.get_run(busy)
        assert still["status"] == "running", still  # B prefilled all along A's run
    finally:
        with contextlib.suppress(ApiError):
            b.cancel_run(busy)
    trace = a.run_trace(short["id"])
    pred = slowest(trace["spans"], WORKER_KINDS)
    assert pred["name"] == "pred", pred
    attrs = pred["attrs"]
    assert attrs["own_tokens"] >= 4 and attrs["batch_size"] >= 2, attrs
    assert attrs["batch_tokens"] - attrs["own_tokens"] > attrs["own_tokens"], attrs
    assert slug_b not in json.dumps(trace)
    assert b.wait(busy, timeout=60)["status"] == "cancelled"


def test_a_cold_sandbox_start_is_recognisable(stack, api_tenant_a, tmp_path):
    """No warm pool: the run starts in a new container, and that start is the slowest span of
    its execution."""
    from symphony_client import Client

    client = Client(stack, api_tenant_a.key_secret, timeout=60)
    run = client.wait(run_lip(client, tmp_path, SHORT, "cold"), timeout=120)
    assert run["status"] == "succeeded", run["error"]
    spans = client.run_trace(run["id"])["spans"]
    # The execution's own spans (what ``queued`` before it waited for is the routing's and
    # Celery's, not the run's start).
    (execute,) = [s for s in spans if s["name"] == "execute"]
    inside = {execute["id"]}
    for span in spans:  # parents come before their children
        if span["parent"] in inside:
            inside.add(span["id"])
    start = slowest([s for s in spans if s["id"] in inside])
    assert (start["name"], start["kind"], start["attrs"]) == ("sandbox.start", "sandbox", {"warm": False}), spans


WRITER = b"""
import symphony as sy


def main(args):
    kv = sy.kv_create(name="doc")
    sy.pred_token(kv, [300 + (11 * i) % 7000 for i in range(2000)])
    kv.close()
    return {"written": True}
"""

READER = b"""
import symphony as sy


def main(args):
    return {"n": len(sy.kv_open("doc"))}
"""


def test_a_kv_file_read_back_from_the_store_is_recognisable(stack, stack_worker, api_tenant_a, tmp_path):
    """A KV file this worker holds only in the store (evicted, as an operator's eviction does):
    the run that opens it has ``kv_open`` as its slowest worker span, and within it a KV move
    from the store with the bytes it read."""
    from symphony_client import Client

    client = Client(stack, api_tenant_a.key_secret, timeout=60)
    written = client.wait(run_lip(client, tmp_path, WRITER, "writer"), timeout=120)
    assert written["status"] == "succeeded", written["error"]
    slug = api_tenant_a.tenant.slug
    stack_worker.admin.kv_evict(slug, "doc")
    blob = Path(stack_worker.kv_store) / slug / "doc.safetensors"
    run = client.wait(run_lip(client, tmp_path, READER, "reader"), timeout=120)
    assert run["status"] == "succeeded" and run["result"] == {"n": 2000}, run
    spans = client.run_trace(run["id"])["spans"]
    opened = slowest(spans, WORKER_KINDS - {"kv_move"})
    assert opened["name"] == "kv_open", spans
    (move,) = [s for s in spans if s["kind"] == "kv_move"]
    assert move["name"] == "store->device" and move["attrs"] == {"bytes": blob.stat().st_size, "file": "doc"}
    assert opened["start_s"] <= move["start_s"] <= move["end_s"] <= opened["end_s"]
