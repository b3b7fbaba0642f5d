"""Quick before/after timing of the KVFS prefix cache (not one of the B benchmarks).

One worker-shaped KVFS over the real engine and the default model: a conversation's next turn
(a ~600-token system prompt + history, then ~40 new tokens) prefilled from scratch (a
``cache=False`` file) against a fresh file whose first append maps the cached whole pages and
computes only the tail. Interleaved repeats; prints one JSON line.

    .venv/bin/python -m bench.prefix_cache_timing [--repeats 5] [--dtype auto]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

from gpu_worker.batch import Batch, SeqWork
from gpu_worker.engine import Engine, EngineConfig
from gpu_worker.kvfs import KVFS, LocalKVStore, Owner
from gpu_worker.model_store import default_model_dir


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--prefix", type=int, default=600)
    ap.add_argument("--tail", type=int, default=40)
    args = ap.parse_args()
    engine = Engine(EngineConfig(model_dir=str(default_model_dir()), dtype=args.dtype, num_pages=64))
    store = tempfile.mkdtemp(prefix="prefix-bench-")
    fs = KVFS(engine.num_pages, engine.block_size, engine.page_bytes, engine, LocalKVStore(store), prefix_cache=True)
    owner = Owner("bench", "s")
    history = [(37 * i + 11) % 20000 + 100 for i in range(args.prefix)]

    def first_pred(tokens: list[int], cache: bool) -> tuple[float, int]:
        t0 = time.perf_counter()
        h = fs.create(owner, cache=cache)
        mapped = fs.map_cached_prefix(owner, h, tokens, len(tokens) - 1)
        plan = fs.plan_append(owner, h, tokens[mapped:])
        n = len(plan.run_token_ids)
        work = SeqWork(plan.seq_id, plan.run_token_ids, plan.num_computed_tokens, plan.page_ids, (n - 1,))
        engine.forward(Batch((work,), plan.page_copies))
        fs.commit_append(plan)
        elapsed = time.perf_counter() - t0
        fs.close(owner, h)
        return elapsed, mapped

    first_pred(history, cache=True)  # the earlier turn: its whole pages are now cached
    scratch, cached, mapped = [], [], 0
    for r in range(args.repeats):
        turn = history + [(r * 7 + i) % 20000 + 100 for i in range(args.tail)]
        scratch.append(first_pred(turn, cache=False)[0])
        elapsed, mapped = first_pred(turn, cache=True)
        cached.append(elapsed)
    engine.close()
    print(
        json.dumps(
            {
                "device": engine.device,
                "dtype": engine.dtype,
                "block_size": engine.block_size,
                "prompt_tokens": args.prefix + args.tail,
                "mapped_tokens": mapped,
                "scratch_ms_p50": round(1000 * statistics.median(scratch), 1),
                "cached_ms_p50": round(1000 * statistics.median(cached), 1),
                "speedup": round(statistics.median(scratch) / statistics.median(cached), 2),
            }
        )
    )


if __name__ == "__main__":
    main()
