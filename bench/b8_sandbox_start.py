"""B8 — sandbox start: start -> first syscall -> exit of an empty LIP, cold and warm.

Runs ``def main(args): return time.time()`` ``runs`` times through ``SandboxLauncher.run`` (cold:
``docker run`` of a fresh gVisor container per run) and ``runs`` times through a
:class:`sandbox.pool.SandboxPool` of two pre-started containers (warm; the pool is refilled
between runs, off the clock, so each warm run meets the steady state of a full pool). Both sides
talk to a real worker session (``hello`` and ``finish`` included). Per run, from the caller:

- ``first syscall``: until the program's ``main`` started (its session ``hello`` is done by then;
  gVisor shares the host clock, so the returned ``time.time()`` is comparable);
- ``exit``: until ``run()`` returned the result.

There is no vLLM side to this benchmark: the "baseline" of its comparisons is the cold path, so
the ratio is warm ÷ cold (lower is better). The targets (p50 cold ≤ 0.5 s, warm ≤ 50 ms) are
checked against the medians and reported in the notes.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.harness import BenchResult, Comparison, WorkerOptions, WorkerProcess, config_dict, workload_args

NAME = "b8_sandbox_start"
EMPTY_LIP = "import time\n\ndef main(args):\n    return time.time()\n"
TARGET_COLD_S = 0.5
TARGET_WARM_S = 0.05


@dataclass(frozen=True)
class Workload:
    runs: int = 15
    pool_size: int = 2


QUICK = Workload(runs=3)


def _one(worker: WorkerProcess, runner: Any, program: Path) -> tuple[float, float]:
    from sandbox.spec import SandboxSpec

    info = worker.admin.create_session("bench-b8", f"b8-{time.monotonic_ns()}", {})
    try:
        spec = SandboxSpec(str(program), {}, info.socket_path, info.token, info.session_id, "bench-b8")
        wall0, t0 = time.time(), time.monotonic()
        res = runner(spec)
        total = time.monotonic() - t0
    finally:
        worker.admin.end_session(info.session_id)
    if res is None or res.status != "succeeded":
        raise RuntimeError(f"run failed: {res}")
    return float(res.result) - wall0, total


def _p90(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(0.9 * (len(xs) - 1)))]


def measure(worker: WorkerProcess, wl: Workload, result: BenchResult) -> None:
    from sandbox.cold import SandboxLauncher
    from sandbox.image import ensure
    from sandbox.pool import SandboxPool
    from sandbox.spec import SandboxLimits

    tag = ensure(log=lambda m: print(m, file=sys.stderr))
    launcher = SandboxLauncher(image=tag)
    first = Comparison("first syscall (warm vs cold)", "s", higher_is_better=False)
    exit_ = Comparison("exit (warm vs cold)", "s", higher_is_better=False)
    with tempfile.TemporaryDirectory(prefix="b8-") as tmp:
        program = Path(tmp) / "empty.py"
        program.write_text(EMPTY_LIP)
        _one(worker, launcher.run, program)  # warm up dockerd and the page cache, off the record
        for _ in range(wl.runs):
            f, t = _one(worker, launcher.run, program)
            first.baseline.add(f)
            exit_.baseline.add(t)
        # The pool hard-links session sockets into its slots: same filesystem as the sessions dir.
        with SandboxPool(launcher, size=wl.pool_size, template=SandboxLimits(image=tag), root=worker.base) as pool:
            for i in range(wl.runs + 1):
                if not pool.wait_ready(pool.size, timeout=120):
                    raise RuntimeError("sandbox pool did not fill")
                time.sleep(0.3)  # let the previous slot's removal finish, off the clock
                f, t = _one(worker, pool.run, program)
                if i:  # the first warm run pays the pool's own first hand-off
                    first.symphony.add(f)
                    exit_.symphony.add(t)
    for c in (first, exit_):
        c.extra.update(
            warm_p90_s=_p90(c.symphony.values),
            cold_p90_s=_p90(c.baseline.values),
            target=f"p50 cold <= {TARGET_COLD_S} s, warm <= {1000 * TARGET_WARM_S:.0f} ms",
        )
    result.comparisons += [first, exit_]
    cold, warm = statistics.median(exit_.baseline.values), statistics.median(exit_.symphony.values)
    result.notes.append(
        f"exit p50: cold {1000 * cold:.0f} ms (target <= {1000 * TARGET_COLD_S:.0f}: "
        f"{'met' if cold <= TARGET_COLD_S else 'missed'}), warm {1000 * warm:.0f} ms "
        f"(target <= {1000 * TARGET_WARM_S:.0f}: {'met' if warm <= TARGET_WARM_S else 'missed'})"
    )


def main(argv: list[str] | None = None) -> int:
    cfg, wl = workload_args(argv, __doc__ or NAME, Workload(), QUICK)
    started = time.perf_counter()
    result = BenchResult(NAME, config_dict(cfg, runs=wl.runs, pool_size=wl.pool_size))
    # The LIP never calls pred: the smallest worker that starts will do.
    with WorkerProcess(WorkerOptions(model=cfg.model, num_pages=8, max_model_len=512, max_num_seqs=4)) as worker:
        worker.wait_ready()
        measure(worker, wl, result)
        # Both figures (warm pool, cold start) are of one worker: its resources on both sides.
        result.sides = {"symphony": worker.resources(), "baseline": worker.resources()}
        result.memory = worker.memory()
    result.wall_s = time.perf_counter() - started
    result.print()
    print(f"  wrote {result.write()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
