"""A run on a worker started with ``--trace off``, through the whole real stack (REST -> Celery
-> gVisor sandbox -> worker -> PostgreSQL): the worker records no span per call, and the run's
trace still answers 200 with the control plane's own marks and says that tracing was off on
that worker (JSON and ``symphony trace``)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

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
    first = sy.generate(kv, sy.tokenize("Nobody traces this run"), max_tokens=3, stop=[])
    sy.sleep(0.2)
    return {"tokens": first + sy.generate(kv, [], max_tokens=2, stop=[])}
"""


@pytest.fixture(scope="module")
def stack_worker(tiny_model_dir: Path) -> Iterator[RunningWorker]:
    with start_worker(tiny_model_dir, name="untraced", extra_args=["--trace", "off"]) as worker:
        yield worker


def test_a_run_on_a_worker_with_tracing_off_says_so_and_keeps_the_control_planes_marks(
    stack, stack_worker, api_tenant_a, tmp_path
):
    import httpx

    from symphony_client import Client

    assert stack_worker.admin.health()["trace"] is False
    lip = tmp_path / "untraced.py"
    lip.write_bytes(LIP)
    client = Client(stack, api_tenant_a.key_secret, timeout=60)
    program = client.upload_program(lip, name="untraced")
    run = client.wait(client.create_run(program["id"], limits={"deadline_s": 60})["id"], timeout=180)
    assert run["status"] == "succeeded" and len(run["result"]["tokens"]) == 5, run

    response = httpx.get(
        f"{stack}/api/v1/runs/{run['id']}/trace", headers={"Authorization": f"Bearer {api_tenant_a.key_secret}"}
    )
    assert response.status_code == 200
    trace = response.json()
    assert trace["complete"] and trace["worker_tracing"] == "off"
    named = {s["name"]: s for s in trace["spans"]}
    marks = {"run", "queued", "execute", "session.create", "sandbox.start", "sandbox.run", "session.end", "end"}
    assert marks <= set(named), sorted(named)
    assert named["worker.session"]["attrs"] == {"tracing": "off"} and named["worker.session"]["duration_s"] > 0
    assert not [s for s in trace["spans"] if s["kind"] in ("syscall", "io", "wait", "kv_move")], trace["spans"]
    assert named["end"]["attrs"]["decode_tokens"] >= 5  # metering does not depend on tracing

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
    assert "tracing was off on its worker" in shown.stdout
