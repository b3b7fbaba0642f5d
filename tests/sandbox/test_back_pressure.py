"""A LIP with far more threads than the worker's in-flight caps, in gVisor against the real
worker: the SDK queues the calls past the caps (no ``Busy``) and every thread gets its own
answer."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.plugins.sandbox import LIPRunner
from tests.plugins.worker import start_worker

pytestmark = [pytest.mark.integration, pytest.mark.docker, pytest.mark.vllm, pytest.mark.timeout(400)]

THREADED_LIP = """
import threading

import symphony as sy

def main(args):
    n, steps = args["threads"], args["steps"]
    prefix = sy.tokenize("Counting slowly, the numbers go")
    root = sy.kv_create()
    sy.pred(root, prefix[:-1])[0].release()
    out, errors = {}, []

    def branch(i):
        try:
            kv = sy.kv_fork(root)
            toks = [prefix[-1]] + sy.tokenize(f" {i}")
            got = []
            for _ in range(steps):  # one pred per step: many calls in flight at once
                t = sy.pred_token(kv, toks)
                got.append(t)
                toks = [t]
            out[i] = got
            kv.close()
        except BaseException as exc:
            errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=branch, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # A few branches again, alone: the same tokens as under load.
    alone = {}
    for i in (0, n // 2, n - 1):
        kv = sy.kv_fork(root)
        alone[str(i)] = sy.generate(kv, [prefix[-1]] + sy.tokenize(f" {i}"), max_tokens=steps, stop=[])
        kv.close()
    return {"done": len(out), "errors": errors[:5], "n_errors": len(errors),
            "sample": {str(i): out.get(i) for i in (0, n // 2, n - 1)}, "alone": alone}
"""


@pytest.fixture(scope="module")
def roomy_runner(tiny_model_dir: Path, launcher) -> LIPRunner:
    """A worker of its own with room for 256 live forks (the shared one has 64 pages)."""
    with start_worker(tiny_model_dir, name="back-pressure", num_pages=640) as worker:
        yield LIPRunner(worker, launcher)


def test_256_threads_complete_through_the_worker_without_busy(roomy_runner) -> None:
    run = roomy_runner.run(THREADED_LIP, {"threads": 256, "steps": 4}, pids=400, memory_mb=512, deadline_s=240)
    res = run.result
    assert res.status == "succeeded", (res.error, res.stderr[-2000:])
    assert res.result["n_errors"] == 0, res.result["errors"]
    assert res.result["done"] == 256
    assert res.result["sample"] == res.result["alone"]
    assert run.session_end.usage["pred_calls"] >= 256 * 4
