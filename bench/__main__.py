"""``python -m bench all|b1|…|b13 [--quick] [--model DIR] [--reps N]``, and
``python -m bench results`` (regenerate ``bench/RESULTS.md`` from ``bench/results/``, run nothing).

Each benchmark runs in its own ``python -m bench.<module>`` subprocess: vLLM allows one engine per
process, and every benchmark hosts one (the baseline ``LLM`` or, for B3, the bare engine
adapter) next to its worker subprocess. ``--quick`` (the CI smoke check) runs B2 on B1's worker
and baseline to stay within its 2-minute budget; B4-B8 are then left out (each runs alone with
``python -m bench b4 --quick``, which tests/bench does too). A summary of every ratio is printed at the end
and written to ``bench/out/summary.json``. A full-mode run (not ``--quick``) also keeps each
benchmark's JSON as its record in ``bench/results/`` and regenerates ``bench/RESULTS.md``
(``bench/results.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from bench import results
from bench.harness import MIN_REPS, OUT_DIR, ROOT, ensure_tiny_model

#: Benchmarks that still run (a retired one keeps its row in RESULTS.md, not a module).
RUNNABLE = [b for b in results.BENCHMARKS if b.runs]
OUTPUTS = {b.key: b.output for b in RUNNABLE}
MODULES = {b.key: f"bench.{b.runs}" for b in RUNNABLE}


def plan(which: str, quick: bool) -> list[tuple[str, list[str]]]:
    """(module, extra args) per subprocess."""
    names = list(MODULES) if which == "all" else [which]
    runs: list[tuple[str, list[str]]] = []
    if quick and "b1" in names and "b2" in names and "b3" in names:
        # One process, B2 and B3 on B1's engines/workers: the 2-minute budget cannot pay for
        # three rounds of vLLM start-ups.
        return [(MODULES["b1"], ["--with-b2", "--with-b3"])]
    runs.extend((MODULES[n], []) for n in names)
    return runs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("which", choices=["all", *MODULES, "results"])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--model", default=None)
    p.add_argument("--reps", type=int, default=MIN_REPS)
    p.add_argument("--dtype", default="float32")
    # Anything else (a workload size such as ``--agents 8``) goes to the benchmark module as is.
    a, passthrough = p.parse_known_args(argv)
    if a.which == "results":
        print(f"wrote {results.write()}")
        return 0
    if passthrough and a.which == "all":
        p.error(f"workload flags need one benchmark, not 'all': {' '.join(passthrough)}")
    common = ["--reps", str(a.reps), "--dtype", a.dtype, *passthrough]
    if a.quick:
        common.append("--quick")
        if a.model is None:
            ensure_tiny_model()  # once, not in each subprocess at the same time
    if a.model:
        common += ["--model", a.model]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "sandbox")])}
    started = time.perf_counter()
    started_wall = time.time()
    failed = []
    for module, extra in plan(a.which, a.quick):
        print(f"### {module} {' '.join(extra + common)}", flush=True)
        rc = subprocess.call([sys.executable, "-m", module, *extra, *common], cwd=ROOT, env=env)
        if rc != 0:
            failed.append(module)
    names = list(OUTPUTS) if a.which == "all" else [a.which]
    summary = {"wall_s": time.perf_counter() - started, "failed": failed, "results": {}}
    recorded: list[str] = []
    print(f"### summary ({summary['wall_s']:.0f}s)")
    for n in names:
        path = OUT_DIR / f"{OUTPUTS[n]}.json"
        if not path.exists() or path.stat().st_mtime < started_wall:
            continue  # not written by this run (failed, or a stale file)
        data = json.loads(path.read_text())
        if not a.quick and results.record_run(path):
            recorded.append(n)
        summary["results"][n] = [
            {
                "name": c["name"],
                "ratio": c["ratio"],
                "symphony": c["symphony"]["median"],
                "baseline": c["baseline"]["median"],
                "unit": c["unit"],
            }
            for c in data["comparisons"]
        ]
        for c in summary["results"][n]:
            print(
                f"  {n} {c['name']:<34} ratio {c['ratio']:.3f}  "
                f"({c['symphony']:.3f} vs {c['baseline']:.3f} {c['unit']})"
            )
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    (OUT_DIR / "summary.json").write_text(json.dumps(summary, indent=2))
    if recorded:
        print(f"### recorded {', '.join(recorded)} in {results.RECORDS_DIR}; wrote {results.write()}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
