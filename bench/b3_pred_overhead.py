"""B3 — cost of the ``pred`` system call: socket round trip vs calling the engine in-process.

Symphony side: B LIP sessions (one connection and one thread each) decode one token per step with
the fused ``pred(..., then="argmax")`` call through the worker subprocess's socket, so each step is
one batched forward in the worker. Baseline: the same engine adapter
(``gpu_worker.engine.Engine.forward``) driven directly in this process, one ``Batch`` of B items
per step, argmax on the returned logits (``gpu_worker.dists.argmax``, the function the worker's
fused ``then="argmax"`` runs). Both sides use the same model, dtype and KV page count.
The difference is everything the syscall path adds: framing, the asyncio server, KVFS
bookkeeping, the scheduler's batching wait and thread hand-offs.

A second Symphony figure, "threads", runs the B sequences as threads of a *single* session (one
LIP with B threads, as in parallel decoding), which exercises the scheduler's "every active
session has a call queued" early-launch rule differently.

Reported: seconds per decode step at batch 1, 8, 32; overhead % = (socket / in-process - 1);
bytes of one ``pred`` reply frame on the wire.

``--trace off`` starts the worker with per-run tracing off (``gpu_worker --trace off``);
``--trace both`` starts a second worker with it off and adds, per batch size, the two workers'
decode steps interleaved ("tracing on" as Symphony, "off" as the baseline): what the per-call
spans cost (docs/ARCHITECTURE.md, "Traces"; target <= 1% of the pred round trip).
``--batches 1,8`` measures fewer batch sizes.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import threading
import time
from typing import Any

from bench.harness import (
    BenchConfig,
    BenchResult,
    Comparison,
    EngineTime,
    WorkerOptions,
    WorkerProcess,
    common_args,
    config_dict,
    interleaved,
    random_tokens,
)
from bench.trace_cost import trace_call_cost_us

NAME = "b3_pred_overhead"


def reply_bytes() -> dict[str, int]:
    """Exact size of the reply frames a decode step gets back (header included)."""
    from gpu_worker import protocol

    req_id = 123_456  # a realistic id after a few thousand calls (msgpack: 5 bytes)
    return {
        "pred_then_argmax": len(protocol.pack(protocol.ok_reply(req_id, {"tokens": [12_345]}))),
        "pred_dists": len(protocol.pack(protocol.ok_reply(req_id, {"dists": [2**40 + 17]}))),
        "dist_argmax": len(protocol.pack(protocol.ok_reply(req_id, 12_345))),
    }


class EngineSide:
    """Decode loop over ``Engine.forward`` in-process, pages assigned by hand."""

    def __init__(self, engine: object, prompt_len: int, steps: int) -> None:
        self.engine = engine
        self.prompt_len = prompt_len
        self.steps = steps
        self.rep = 0

    def run(self, batch: int, prompts: list[list[int]]) -> float:
        from gpu_worker.batch import Batch, SeqWork
        from gpu_worker.dists import argmax

        eng = self.engine
        self.rep += 1
        pps = -(-(self.prompt_len + self.steps + 1) // eng.block_size)
        ids = [f"e{self.rep}-{i}" for i in range(batch)]
        pages = [tuple(range(1 + i * pps, 1 + (i + 1) * pps)) for i in range(batch)]
        # Prefill (untimed) in groups within the engine's token budget.
        per_forward = max(1, eng.config.max_num_batched_tokens // self.prompt_len)
        toks: list[int] = []
        for lo in range(0, batch, per_forward):
            group = range(lo, min(batch, lo + per_forward))
            items = [SeqWork(ids[i], tuple(prompts[i]), 0, pages[i], (self.prompt_len - 1,)) for i in group]
            toks += [argmax(row[-1]) for row in eng.forward(Batch(tuple(items)))]
        n = self.prompt_len
        start = time.perf_counter()
        for _ in range(self.steps):
            items = [SeqWork(ids[i], (toks[i],), n, pages[i], (0,)) for i in range(batch)]
            logits = eng.forward(Batch(tuple(items)))
            toks = [argmax(row[-1]) for row in logits]
            n += 1
        elapsed = time.perf_counter() - start
        for s in ids:
            eng.release(s)
        return elapsed / self.steps


class SocketSide:
    """Decode loop through the worker socket with the SDK's fused ``pred_token``."""

    def __init__(self, worker: WorkerProcess, steps: int) -> None:
        self.worker = worker
        self.steps = steps
        #: The engine's time over the timed decode loops, per figure (``EngineTime``).
        self.engine: dict[str, EngineTime] = {}

    def run(self, batch: int, prompts: list[list[int]], one_session: bool) -> float:
        sessions = []
        n_sessions = 1 if one_session else batch
        for _ in range(n_sessions):
            sessions.append(self.worker.connect("bench-b3"))
        start_evt = threading.Barrier(batch + 1)
        done: list[float] = []

        errors: list[BaseException] = []

        def lip(i: int) -> None:
            try:
                sess = sessions[0 if one_session else i][0]
                kv = sess.kv_create()
                tok = sess.pred_token(kv, prompts[i])
                start_evt.wait()
                for _ in range(self.steps):
                    tok = sess.pred_token(kv, [tok])
                done.append(time.perf_counter())
                sess.kv_close(kv)
            except BaseException as exc:
                errors.append(exc)
                start_evt.abort()  # never leave the others (and the timer) waiting

        threads = [threading.Thread(target=lip, args=(i,), daemon=True) for i in range(batch)]
        for t in threads:
            t.start()
        try:
            start_evt.wait()
        except threading.BrokenBarrierError:
            pass
        start = time.perf_counter()
        window = self.engine.setdefault(f"{batch}{'/1' if one_session else ''}", EngineTime(self.worker))
        with window.measure():
            for t in threads:
                t.join()
        if errors:
            raise errors[0]
        elapsed = max(done) - start
        for sess, sid in sessions:
            self.worker.end(sess, sid)
        return elapsed / self.steps


def engine_resources(engine: Any, max_batch: int) -> dict[str, Any]:
    """The in-process engine's side of the record: it runs in this process, on the forward
    threads it set up (``Engine.forward_threads``), with its own KV pages and page size."""
    from bench.harness import this_process_env
    from bench.resources import side

    return side(
        pid=os.getpid(),
        env=this_process_env(),
        dtype=engine.dtype,
        max_batch=max_batch,
        kv_pages=engine.num_pages,
        page_bytes=engine.page_bytes,
        forward_threads=engine.forward_threads,
        compiled=engine.compiled,
    )


def worker_options(cfg: BenchConfig) -> WorkerOptions:
    # Pages: 32 sequences x ceil((prompt + steps + 1) / block) pages, plus slack and page 0.
    return WorkerOptions(model=cfg.model, num_pages=32 * 2 + 8, dtype=cfg.dtype, max_model_len=1024)


def _own_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """B3's own flags (``--trace``, ``--batches``); the rest are every benchmark's."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--trace", choices=("on", "off", "both"), default="on")
    p.add_argument("--batches", default="1,8,32", help="batch sizes, comma-separated")
    return p.parse_known_args(argv)


def main(argv: list[str] | None = None) -> int:
    own, rest = _own_args(argv)
    cfg = common_args(rest, __doc__ or NAME)
    opts = dataclasses.replace(worker_options(cfg), trace=own.trace != "off")
    untraced = WorkerProcess(dataclasses.replace(opts, trace=False)) if own.trace == "both" else None
    batches = [int(b) for b in own.batches.split(",")]
    run(cfg, WorkerProcess(opts), time.perf_counter(), batches=batches, untraced=untraced)
    return 0


def run(
    cfg: BenchConfig,
    worker: WorkerProcess,
    started: float,
    batches: list[int] | None = None,
    untraced: WorkerProcess | None = None,
) -> BenchResult:
    """B3 against ``worker`` (already starting; closed here). Called by ``main`` and, in
    ``--quick``, by B1's process after it closed its baseline (saves a process start-up).
    ``untraced``: a second worker with tracing off (also closed here), compared with ``worker``."""
    batches = batches or [1, 8, 32]
    prompt_len = 32 if cfg.quick else 128
    steps = 8 if cfg.quick else 32
    reps = cfg.reps
    result = BenchResult(
        NAME,
        config_dict(
            cfg,
            batches=batches,
            prompt_len=prompt_len,
            steps=steps,
            trace="both" if untraced else ("on" if worker.opts.trace else "off"),
        ),
    )
    opts = worker.opts
    num_pages = opts.num_pages
    try:
        from bench.baseline_vllm import worker_compiles
        from gpu_worker.config import env_defaults
        from gpu_worker.engine import Engine, EngineConfig

        defaults = env_defaults()

        engine = Engine(
            EngineConfig(
                model_dir=cfg.model,
                dtype=cfg.dtype,
                num_pages=num_pages,
                max_num_batched_tokens=opts.max_num_batched_tokens + opts.max_model_len,
                max_num_seqs=opts.max_num_seqs,
                max_model_len=opts.max_model_len,
                # Compiled or eager as the worker is (its default, SYMPHONY_COMPILE), from the
                # same compile cache: the two sides run the same model code.
                compile=worker_compiles(),
                compile_cache_dir=os.path.abspath(str(defaults["compile_cache_dir"])),
            )
        )
        worker.wait_ready()
        eng_side = EngineSide(engine, prompt_len, steps)
        sock_side = SocketSide(worker, steps)
        off_side = None
        prompts = [random_tokens(prompt_len, cfg.seed, 3, i) for i in range(max(batches))]
        # Warm both paths once (first forwards allocate, first connections import).
        eng_side.run(2, prompts)
        sock_side.run(2, prompts, one_session=False)
        if untraced is not None:
            untraced.wait_ready()
            off_side = SocketSide(untraced, steps)
            off_side.run(2, prompts, one_session=False)
        with worker.sample_pages():
            for b in batches:
                cmp = Comparison(f"decode step, batch {b}", "ms", higher_is_better=False)
                interleaved(
                    reps,
                    lambda b=b: 1000 * sock_side.run(b, prompts, one_session=False),
                    lambda b=b: 1000 * eng_side.run(b, prompts),
                    cmp,
                )
                cmp.extra["overhead_pct"] = 100 * (cmp.ratio - 1)
                cmp.extra["target"] = "overhead <= 5% at batch >= 8"
                cmp.extra["engine"] = sock_side.engine[str(b)].to_dict()
                result.comparisons.append(cmp)
                print("  " + cmp.line(), flush=True)
                print("    " + sock_side.engine[str(b)].line(), flush=True)
                if off_side is not None:
                    cost = Comparison(f"decode step, batch {b}, tracing on vs off", "ms", higher_is_better=False)
                    interleaved(
                        reps,
                        lambda b=b: 1000 * sock_side.run(b, prompts, one_session=False),
                        lambda b=b, off=off_side: 1000 * off.run(b, prompts, one_session=False),
                        cost,
                    )
                    cost.extra["tracing_cost_pct"] = 100 * (cost.ratio - 1)
                    cost.extra["target"] = "tracing <= 1% of the pred round trip"
                    result.comparisons.append(cost)
                    print("  " + cost.line(), flush=True)
                # One session may have only 16 preds in flight (SchedulerConfig), so the
                # one-LIP-many-threads variant is measured at batch 8.
                if b == 8 and not cfg.quick:
                    thr = Comparison(f"decode step, batch {b}, 1 session", "ms", higher_is_better=False)
                    interleaved(
                        reps,
                        lambda b=b: 1000 * sock_side.run(b, prompts, one_session=True),
                        lambda b=b: 1000 * eng_side.run(b, prompts),
                        thr,
                    )
                    thr.extra["overhead_pct"] = 100 * (thr.ratio - 1)
                    thr.extra["engine"] = sock_side.engine[f"{b}/1"].to_dict()
                    result.comparisons.append(thr)
                    print("  " + thr.line(), flush=True)
                    print("    " + sock_side.engine[f"{b}/1"].line(), flush=True)
        result.sides = {"symphony": worker.resources(), "baseline": engine_resources(engine, opts.max_num_seqs)}
        result.memory = worker.memory()
        result.memory["pred_reply_bytes"] = reply_bytes()
        result.memory["trace_call_us"] = trace_call_cost_us()
        result.memory["engine_stats"] = engine.stats()
        engine.close()
    finally:
        worker.close()
        if untraced is not None:
            untraced.close()
    result.wall_s = time.perf_counter() - started
    result.print()
    print(f"  wrote {result.write()}")
    return result


if __name__ == "__main__":
    sys.exit(main())
