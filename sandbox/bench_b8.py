"""BENCHMARKS.md B8: start -> first syscall -> exit of an empty LIP, cold and warm.

``python -m sandbox.bench_b8 [-n 15]`` starts a worker on the tiny model (as the tests do), then
runs ``def main(args): return time.time()`` N times through ``SandboxLauncher.run`` (cold) and
N times through a :class:`~sandbox.pool.SandboxPool` (warm; the pool is refilled between runs,
off the clock). Per run it records, from the caller's ``run()``:

- ``first_syscall``: until the program's ``main`` started (its session ``hello`` is done by then;
  measured with the host clock, which gVisor shares);
- ``exit``: until ``run()`` returned the result (the session's ``finish`` included).

Prints one JSON object with p50/p90 per path (seconds).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

EMPTY_LIP = "import time\n\ndef main(args):\n    return time.time()\n"


def _q(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def _summary(rows: list[tuple[float, float]]) -> dict[str, Any]:
    first = [r[0] for r in rows]
    total = [r[1] for r in rows]
    return {
        "n": len(rows),
        "first_syscall_p50_s": round(statistics.median(first), 4),
        "exit_p50_s": round(statistics.median(total), 4),
        "exit_p90_s": round(_q(total, 0.9), 4),
        "exit_min_s": round(min(total), 4),
    }


def _one(worker: Any, runner: Any, program: Path) -> tuple[float, float]:
    from sandbox.launcher import SandboxSpec

    info = worker.create_session("bench-b8")
    try:
        spec = SandboxSpec(str(program), {}, info.socket_path, info.token, info.session_id, "bench-b8")
        wall0, t0 = time.time(), time.monotonic()
        res = runner(spec)
        total = time.monotonic() - t0
    finally:
        worker.end_session(info.session_id)
    if res is None or res.status != "succeeded":
        raise RuntimeError(f"run failed: {res}")
    return float(res.result) - wall0, total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sandbox.bench_b8", description=__doc__)
    parser.add_argument("-n", type=int, default=15)
    args = parser.parse_args(argv)

    from gpu_worker.model_store import ensure_default_model, write_tiny_model
    from sandbox.image import ensure
    from sandbox.launcher import SandboxLauncher, SandboxLimits
    from sandbox.pool import SandboxPool
    from tests.plugins.worker import start_worker

    tag = ensure(log=lambda m: print(m, file=sys.stderr))
    launcher = SandboxLauncher(image=tag)
    with tempfile.TemporaryDirectory(prefix="b8-") as tmp:
        program = Path(tmp) / "empty.py"
        program.write_text(EMPTY_LIP)
        model = write_tiny_model(Path(tmp) / "tiny", ensure_default_model())
        with start_worker(model) as worker:
            _one(worker, launcher.run, program)  # warm up dockerd / page cache
            cold = [_one(worker, launcher.run, program) for _ in range(args.n)]
            with SandboxPool(launcher, size=2, template=SandboxLimits(image=tag)) as pool:
                warm = []
                for _ in range(args.n + 1):
                    if not pool.wait_ready(pool.size, timeout=120):  # steady state: pool full
                        raise RuntimeError("pool not ready")
                    time.sleep(0.3)  # let the previous slot's removal finish (off the clock)
                    warm.append(_one(worker, pool.run, program))
                warm = warm[1:]
    print(json.dumps({"benchmark": "B8", "cold": _summary(cold), "warm": _summary(warm)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
