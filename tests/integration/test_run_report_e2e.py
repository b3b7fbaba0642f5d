"""What a LIP author reads back about a run, through the whole real stack (REST -> Celery ->
gVisor -> worker on the tiny model -> PostgreSQL): the run's usage, timings and cost in
``GET /runs/<id>`` and ``symphony runs show``, a result with its keys in the program's order,
a deadline error that names the deadline the author set, and tool hosts the tenant's owner
manages: a run naming others is refused when created, one within them reaches the worker's
allowlist."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT, wait_for
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
    if args["mode"] == "write":
        kv = sy.kv_create(args["file"])
        sy.pred(kv, sy.tokenize("A stored document that a later run reuses without computing it again."))
        return {"zeta": 1, "alpha": {"yy": 2, "b": 3}, "mid": len(kv)}
    if args["mode"] == "read":
        kv = sy.kv_open(args["file"])
        out = sy.generate(kv, [], max_tokens=4, stop=[])
        for tok in out:
            sy.send_to_user(sy.detokenize([tok]))
        sy.send_to_user({"z": len(out), "a": [1, None]})
        return {"tokens": out}
    if args["mode"] == "fetch":
        out = {}
        for host in args["hosts"]:
            try:
                sy.http_fetch(f"http://{host}/", timeout=5)
                out[host] = "ok"
            except sy.SymphonyError as exc:
                out[host] = f"{type(exc).__name__}: {exc}"
        return out
    while True:  # "spin": never calls the worker again
        pass
"""


@pytest.fixture(scope="module")
def stack_worker(tiny_model_dir: Path) -> Iterator[RunningWorker]:
    with start_worker(tiny_model_dir, name="report") as worker:
        yield worker


def _finished(client, run_id: str) -> dict:
    wait_for(lambda: client.get_run(run_id)["status"] not in ("queued", "running"), timeout=120)
    return client.get_run(run_id)


def test_a_run_reports_usage_timings_cost_and_its_result_as_returned(stack, api_tenant_a, tmp_path):
    from symphony_client import Client

    lip = tmp_path / "report.py"
    lip.write_bytes(LIP)
    client = Client(stack, api_tenant_a.key_secret, timeout=60)
    program = client.upload_program(lip, name="report")
    write = client.create_run(program["id"], args={"mode": "write", "file": "doc"}, limits={"deadline_s": 60})
    written = _finished(client, write["id"])
    assert written["status"] == "succeeded", written["error"]
    # Keys in the program's order (jsonb would give alpha, mid, zeta and b, yy).
    assert list(written["result"]) == ["zeta", "alpha", "mid"] and list(written["result"]["alpha"]) == ["yy", "b"]
    doc_tokens = written["result"]["mid"]

    read = client.create_run(program["id"], args={"mode": "read", "file": "doc"}, limits={"deadline_s": 60})
    events = list(client.events(read["id"]))
    final = client.get_run(read["id"])
    assert final["status"] == "succeeded", final["error"]
    usage, timings = final["usage"], final["timings"]
    assert usage["cached_tokens"] == doc_tokens  # the stored file it opened
    assert usage["decode_tokens"] >= 4 and usage["pred_calls"] >= 4
    assert 4 <= usage["forwards"] <= usage["pred_calls"]
    assert sum(e.type == "token" for e in events) == 4
    # JSON goes out enveloped as documented (docs/API.md): {"data": <what the program sent>}.
    assert [e.data for e in events if e.type == "message"] == [{"data": {"z": 4, "a": [1, None]}}]
    assert usage["streamed_events"] == 5
    assert usage["streamed_bytes"] > 0 and usage["sandbox_seconds"] > 0 and usage["page_seconds"] >= 0
    assert usage["cost"]["currency"] == "USD" and float(usage["cost"]["total"]) > 0
    assert timings["queue_wait_s"] >= 0 and timings["run_s"] > 0
    assert timings["queue_wait_s"] <= timings["time_to_first_token_s"] <= timings["queue_wait_s"] + timings["run_s"] + 1
    assert written["usage"]["cached_tokens"] == 0 and written["usage"]["prefill_tokens"] >= doc_tokens

    env = {k: v for k, v in os.environ.items() if not k.startswith("SYMPHONY_")}
    env.update(PYTHONPATH=str(ROOT / "client"), SYMPHONY_CONFIG=str(tmp_path / "cli.json"))
    flags = ["--url", stack, "--api-key", api_tenant_a.key_secret]
    shown = subprocess.run(
        [sys.executable, "-m", "symphony_client", "runs", "show", read["id"], "--human", *flags],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    fields = {line.split()[0]: line.split()[1:] for line in shown.stdout.splitlines() if line.strip()}
    assert fields["cached_tokens"] == [str(doc_tokens)] and fields["streamed_events"] == ["5"]
    assert fields["cost"] == [usage["cost"]["total"], "USD"]


def test_a_deadline_error_names_the_deadline_set(stack, api_tenant_a, tmp_path):
    from symphony_client import Client

    lip = tmp_path / "spin.py"
    lip.write_bytes(LIP)
    client = Client(stack, api_tenant_a.key_secret, timeout=60)
    program = client.upload_program(lip, name="spin")
    run = client.create_run(program["id"], args={"mode": "spin"}, limits={"deadline_s": 2})
    final = _finished(client, run["id"])
    assert final["status"] == "timed_out", final
    assert "deadline of 2s exceeded" in final["error"], final["error"]
    assert "7s" not in final["error"]


def test_tool_hosts_an_owner_sets_bound_what_runs_may_name_and_reach(stack, api_tenant_a, tmp_path):
    from symphony_client import ApiError, Client

    owner = api_tenant_a.session_client()
    put = owner.put("/api/v1/tool-hosts", {"hosts": ["tools.invalid", "more.invalid:8080"]}, format="json")
    assert put.status_code == 200, put.content
    lip = tmp_path / "fetch.py"
    lip.write_bytes(LIP)
    client = Client(stack, api_tenant_a.key_secret, timeout=60)
    program = client.upload_program(lip, name="fetch")
    with pytest.raises(ApiError) as refused:
        client.create_run(
            program["id"],
            args={"mode": "fetch", "hosts": []},
            limits={"allowed_hosts": ["tools.invalid", "evil.invalid"]},
        )
    assert refused.value.status == 400 and refused.value.code == "invalid"
    assert "evil.invalid" in refused.value.message and "tools.invalid" not in refused.value.message

    hosts = ["tools.invalid", "more.invalid:8080"]
    run = client.create_run(
        program["id"],
        args={"mode": "fetch", "hosts": hosts},
        limits={"allowed_hosts": ["tools.invalid"], "deadline_s": 60},
    )
    final = _finished(client, run["id"])
    assert final["status"] == "succeeded", final["error"]
    # Listed for the run: the worker lets it through to DNS (.invalid never resolves).
    assert (
        final["result"]["tools.invalid"].startswith("IOFailed") and "cannot resolve" in final["result"]["tools.invalid"]
    )
    # The tenant's but narrowed away by this run: EPERM that says where the list comes from.
    narrowed = final["result"]["more.invalid:8080"]
    assert narrowed.startswith("PermissionDenied") and "narrowed by the run's limits.allowed_hosts" in narrowed
