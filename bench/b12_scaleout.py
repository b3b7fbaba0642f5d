"""B12 — scale-out: B2's greedy completion on one worker vs two local workers of half its KV budget.

The same prompts and LIP loop as B2's socket-only figure (``kv_create``, fused
``pred_token`` per token, ``kv_close``, ``max_batch`` at once). **Baseline**: one worker with B2's
page budget serving all lanes. **Symphony** (the figure under test): two workers started the
same way with half the pages and half the batch each, the prompts split between them, served at
once, timed together. The ratio is two workers' tokens/s over one worker's.

What it says depends on the machine: both workers share its CPU cores (and, on a GPU host, would
each own a GPU), so on a small CPU box two workers mostly compete for the same cores. The CPU
count is in the result's ``machine`` block and printed beside the ratio.
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict, replace

from bench.b2_completion import QUICK, Workload, symphony_side
from bench.harness import (
    BenchResult,
    Comparison,
    WorkerOptions,
    WorkerProcess,
    config_dict,
    interleaved,
    max_len_for,
    random_tokens,
    run_threads,
    stopwatch,
    workload_args,
)
from bench.resources import combined

NAME = "b12_scaleout"


def two_workers_side(workers: list[WorkerProcess], wl: Workload, prompts: list[list[int]]) -> float:
    """Output tokens/s of all prompts, split evenly over ``workers`` and served at once."""
    n = len(workers)
    shares = [prompts[i::n] for i in range(n)]
    per_worker = [replace(wl, prompts=len(s), max_batch=max(1, wl.max_batch // n)) for s in shares]
    sides = zip(workers, per_worker, shares, strict=True)
    with stopwatch() as t:
        run_threads([lambda w=w, p=p, s=s: symphony_side(w, p, s) for w, p, s in sides])
    return len(prompts) * wl.out_tokens / t[0]


def main(argv: list[str] | None = None) -> int:
    import time

    cfg, wl = workload_args(argv, __doc__ or NAME, Workload(), QUICK)
    max_len = max_len_for(wl.prompt_tokens + wl.out_tokens)
    min_pages = max_len // 128 + 2  # vLLM needs one sequence of max_len to fit
    full = max(wl.pages(128), min_pages)
    one_opts = WorkerOptions(
        model=cfg.model, num_pages=full, dtype=cfg.dtype, max_model_len=max_len, max_num_seqs=wl.max_batch
    )
    half_opts = replace(one_opts, num_pages=max(full // 2 + 1, min_pages), max_num_seqs=max(1, wl.max_batch // 2))
    prompts = [random_tokens(wl.prompt_tokens, cfg.seed, i) for i in range(wl.prompts)]
    started = time.perf_counter()
    result = BenchResult(NAME, config_dict(cfg, **asdict(wl), device_pages=full, half_pages=half_opts.num_pages))
    workers = [WorkerProcess(one_opts), WorkerProcess(half_opts), WorkerProcess(half_opts)]
    try:
        for w in workers:
            w.wait_ready()
        one, pair = workers[0], workers[1:]
        cmp = Comparison("B2 socket only: 2 workers / 1", "tok/s", extra={"cpus": os.cpu_count()})
        interleaved(cfg.reps, lambda: two_workers_side(pair, wl, prompts), lambda: symphony_side(one, wl, prompts), cmp)
        result.comparisons.append(cmp)
        result.sides = {"symphony": combined([w.resources() for w in pair]), "baseline": one.resources()}
        result.notes.append(
            f"{os.cpu_count()} CPUs shared by both workers: two workers compete for the same cores here; "
            "on a GPU host each worker owns its GPU, so its forwards do not slow the other's"
        )
    finally:
        for w in workers:
            w.close()
    result.wall_s = time.perf_counter() - started
    result.print()
    print(f"  wrote {result.write()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
