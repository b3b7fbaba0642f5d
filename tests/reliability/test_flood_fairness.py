"""A LIP flooding the worker with tiny ``pred`` calls must not slow another tenant's run much.

Tenant A's program runs 64 threads, each calling ``pred`` with one token as fast as it can (a
bounded time, then it stops by itself); tenant B's canary is a small completion (a prefill and
32 decode steps, the README's loop). Both run in the real gVisor sandbox against a real worker.
The canary's time inside its sandbox under the flood, against its idle time (medians of
alternating runs, since this 2-core machine is shared), must stay within ``MAX_RATIO``; it
was 3.4x (9.9 s against 2.9 s end to end) before the scheduler capped a tenant's seats.

The bound sits between the two: with the cap it measures 1.1-1.4x alone and up to 1.8x while the
rest of the suite's processes (PostgreSQL, Redis, dockerd, leftover containers) share the two
cores with the flood's 64 sandbox threads, whose CPU time no scheduler of ours can take back.
"""

from __future__ import annotations

import statistics
import threading
import time
from pathlib import Path

import pytest

from tests.plugins.sandbox import LIPRunner
from tests.plugins.worker import start_worker

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.docker, pytest.mark.timeout(600)]

MAX_RATIO = 2.0
ROUNDS = 5
FLOOD_THREADS = 64
#: How long the flood keeps going once started; the canary runs inside this window.
FLOOD_SECONDS = 20.0

FLOOD_LIP = """
import threading
import time

from symphony import kv_create, kv_truncate, pred_token


def main(args):
    stop_at = time.monotonic() + args["seconds"]
    counts = [0] * args["threads"]

    def lane(i):
        kv = kv_create()
        pred_token(kv, [1, 2, 3])
        while time.monotonic() < stop_at:
            pred_token(kv, [5 + i])
            counts[i] += 1
            if counts[i] % 32 == 0:
                kv_truncate(kv, 3)

    threads = [threading.Thread(target=lane, args=(i,)) for i in range(args["threads"])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"preds": sum(counts)}
"""

CANARY_LIP = """
import time

from symphony import kv_create, pred, tokenize


def main(args):
    started = time.perf_counter()
    kv = kv_create()
    dist = pred(kv, tokenize(args["prompt"]))[-1]
    out = []
    for _ in range(32):
        tok = dist.argmax()
        out.append(tok)
        dist = pred(kv, [tok])[-1]
    return {"seconds": time.perf_counter() - started, "tokens": len(out)}
"""

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle. " * 3


@pytest.fixture(scope="module")
def worker(tiny_model_dir: Path):
    """A private worker with room for the flood's 64 lanes."""
    with start_worker(tiny_model_dir, name="flood", num_pages=512) as w:
        yield w


def _canary(runner: LIPRunner) -> tuple[float, float]:
    """(seconds inside the sandbox, seconds end to end) of one canary run."""
    started = time.monotonic()
    run = runner.run(CANARY_LIP, {"prompt": PROMPT}, tenant="tenant-canary", deadline_s=120.0)
    wall = time.monotonic() - started
    assert run.result.status == "succeeded", run.result
    assert run.result.result["tokens"] == 32
    return run.result.result["seconds"], wall


def _flood(runner: LIPRunner, done: dict) -> None:
    done["run"] = runner.run(
        FLOOD_LIP,
        {"threads": FLOOD_THREADS, "seconds": FLOOD_SECONDS},
        tenant="tenant-flood",
        deadline_s=FLOOD_SECONDS + 60,
        pids=128,
    )


def test_a_flooding_lip_keeps_another_tenants_run_within_bound(worker, launcher) -> None:
    runner = LIPRunner(worker, launcher)
    _canary(runner)  # warm: the image's first start and the model's first shapes
    idle: list[tuple[float, float]] = []
    flooded: list[tuple[float, float]] = []
    flood_preds: list[int] = []
    for _ in range(ROUNDS):
        idle.append(_canary(runner))
        done: dict = {}
        flood = threading.Thread(target=_flood, args=(runner, done))
        before = worker.admin.stats()["scheduler"]["calls"]
        flood.start()
        deadline = time.monotonic() + 30
        # The flood is on once its calls reach the worker.
        while worker.admin.stats()["scheduler"]["calls"] < before + 500 and time.monotonic() < deadline:
            time.sleep(0.2)
        flooded.append(_canary(runner))
        overlapped = flood.is_alive()
        flood.join(timeout=FLOOD_SECONDS + 90)
        result = done["run"].result
        assert result.status == "succeeded", (result.status, result.stderr[-2000:])
        assert overlapped, "the flood ended before the canary did: raise FLOOD_SECONDS"
        flood_preds.append(result.result["preds"])
    inside = statistics.median(t for t, _ in flooded) / statistics.median(t for t, _ in idle)
    wall = statistics.median(w for _, w in flooded) / statistics.median(w for _, w in idle)
    print(
        f"\ncanary idle (inside, end to end): {[(round(a, 2), round(b, 2)) for a, b in idle]}"
        f"\ncanary under flood:               {[(round(a, 2), round(b, 2)) for a, b in flooded]}"
        f"\nflood preds per run: {flood_preds}"
        f"\nratio of medians: inside the sandbox {inside:.2f}x, end to end {wall:.2f}x (bound {MAX_RATIO}x)"
    )
    worker.assert_alive()
    assert inside <= MAX_RATIO, f"the flood slowed the canary {inside:.2f}x (bound {MAX_RATIO}x)"
    assert wall <= MAX_RATIO, f"the flood slowed the canary's run {wall:.2f}x end to end (bound {MAX_RATIO}x)"
