"""B1 — RAG over a Pareto-popular document set: persistent KV files vs vLLM prefix caching.

Workload: ``docs`` documents of ``doc_tokens`` tokens; each request picks a document by
Pareto(alpha) popularity (``harness.pareto_trace``), appends a ``question_tokens`` question and
decodes ``out_tokens`` greedy tokens; ``in_flight`` requests run at once. Each repetition serves
its own stretch of that request stream (same ranking, fresh draws and questions).

Symphony side (the LIP's retention policy): every document's KV is computed once and stored as a
persistent named KV file (``doc-<i>``); the ``hot`` most popular are pinned, so they stay on
device within the page budget; the rest are left to KVFS, which spills idle unpinned files to host
memory (and disk) under pressure and reloads them on ``kv_open`` instead of recomputing. Each
request opens its document read-only (a private copy-on-write fork: no page is copied, the
question goes to a fresh page), decodes, and closes the fork. ``in_flight`` LIP sessions of one
tenant run concurrently, as ``in_flight`` threads.

Baseline: vLLM ``LLM.generate`` of the same prompts (document + question, same order) with
automatic prefix caching and exactly as many KV blocks as the worker has device pages, max batch
``in_flight``. Both sides ingest every document once before the timed window (vLLM: a 1-token
generate per document, which leaves its prefix cache warm for whatever still fits).

Figure: requests/s at each alpha, ratio Symphony ÷ vLLM (target >= 7x where skew matters, >= 1x
everywhere), plus the one-off ingestion time of both sides.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict, dataclass

from bench.baseline_vllm import VLLMBaseline
from bench.harness import (
    MIN_REPS,
    BenchConfig,
    BenchResult,
    Comparison,
    WorkerOptions,
    WorkerProcess,
    baseline_blocks,
    config_dict,
    default_model,
    fill_sides,
    hottest_docs,
    pareto_trace,
    random_tokens,
    repetition_starts,
    share_out,
    stopwatch,
)

NAME = "b1_rag_pareto"
TENANT = "bench-b1"


@dataclass(frozen=True)
class Workload:
    """Sizes of one B1 run (defaults: the sizes in bench/README.md)."""

    docs: int = 200
    doc_tokens: int = 1024
    question_tokens: int = 32
    out_tokens: int = 16
    requests: int = 64
    in_flight: int = 8
    #: Share of the documents that fit on device (pinned hot set) besides the working set.
    hot_fraction: float = 0.25
    alphas: tuple[float, ...] = (0.5, 1.0, 1.5, 2.0, 3.0)

    def pages(self, block_size: int) -> tuple[int, int]:
        """(device pages incl. page 0, pinned hot docs): hot docs + one reloaded doc and one
        private page per in-flight request."""
        doc_pages = -(-self.doc_tokens // block_size)
        tail = -(-(self.doc_tokens + self.question_tokens + self.out_tokens) // block_size) - doc_pages
        hot = max(1, int(self.docs * self.hot_fraction))
        return 1 + hot * doc_pages + self.in_flight * (doc_pages + tail), hot


QUICK = Workload(docs=12, doc_tokens=256, question_tokens=16, out_tokens=4, requests=16, in_flight=4, alphas=(0.5, 3.0))


class SymphonyRag:
    """The RAG LIP's side: persistent document files, pinned hot set, a fork per request."""

    def __init__(self, worker: WorkerProcess, wl: Workload, docs: list[list[int]]) -> None:
        self.worker = worker
        self.wl = wl
        self.docs = docs
        self.sessions = [worker.connect(TENANT) for _ in range(wl.in_flight)]
        self.pinned: set[int] = set()

    def ingest(self) -> float:
        """Compute each document's KV once into ``doc-<i>`` (in_flight at a time)."""

        def ingest_one(k: int, i: int) -> None:
            sess = self.sessions[k][0]
            kv = sess.kv_create(f"doc-{i}")
            sess.pred_token(kv, self.docs[i])
            sess.kv_close(kv)

        with stopwatch() as t:
            share_out(range(len(self.docs)), self.wl.in_flight, ingest_one)
        return t[0]

    def pin_hot(self, hot: list[int]) -> None:
        """The retention policy: pin the hottest documents, unpin the rest."""
        sess = self.sessions[0][0]
        for i in self.pinned - set(hot):
            sess.kv_pin(f"doc-{i}", False)
        for i in set(hot) - self.pinned:
            sess.kv_pin(f"doc-{i}", True)
        self.pinned = set(hot)

    def serve(self, trace: list[int], questions: list[list[int]]) -> float:
        """Run the trace with ``in_flight`` concurrent LIP sessions; returns requests/s."""
        out = self.wl.out_tokens

        def request(k: int, r: int) -> None:
            sess = self.sessions[k][0]
            kv = sess.kv_open(f"doc-{trace[r]}", "r")  # COW fork, reloaded if spilled
            tok = sess.pred_token(kv, questions[r])
            for _ in range(out - 1):
                tok = sess.pred_token(kv, [tok])
            sess.kv_close(kv)

        with stopwatch() as t:
            share_out(range(len(trace)), self.wl.in_flight, request)
        return len(trace) / t[0]


def parse(argv: list[str] | None) -> tuple[argparse.Namespace, Workload]:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default=None)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--reps", type=int, default=MIN_REPS)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--seed", type=int, default=0)
    for f in ("docs", "doc_tokens", "question_tokens", "out_tokens", "requests", "in_flight"):
        p.add_argument("--" + f.replace("_", "-"), type=int, default=None)
    p.add_argument("--hot-fraction", type=float, default=None)
    p.add_argument("--alphas", default=None, help="comma-separated, e.g. 0.5,1,3")
    p.add_argument(
        "--vllm-offload-gib",
        type=float,
        default=None,
        help="baseline = vLLM APC + its CPU KV offload of this size (CUDA/XPU only in vllm 0.32)",
    )
    p.add_argument("--with-b3", action="store_true", help="then run B3 in this process (quick smoke check)")
    p.add_argument("--with-b2", action="store_true", help="also run B2 (quick sizes) on this worker + baseline")
    a = p.parse_args(argv)
    wl = QUICK if a.quick else Workload()
    changes = {
        f: getattr(a, f)
        for f in ("docs", "doc_tokens", "question_tokens", "out_tokens", "requests", "in_flight", "hot_fraction")
        if getattr(a, f) is not None
    }
    if a.alphas:
        changes["alphas"] = tuple(float(x) for x in a.alphas.split(","))
    wl = Workload(**{**asdict(wl), **changes})
    a.model = a.model or default_model(a.quick)
    return a, wl


def run_b2_here(worker: WorkerProcess, base: VLLMBaseline, cfg: BenchConfig, started: float) -> None:
    """B2's quick figure on B1's worker and baseline: ``--quick`` cannot afford a third pair of
    engine start-ups within its 2-minute budget. Written as ``b2_completion.json``."""
    from bench import b2_completion as b2

    wl2 = b2.QUICK
    res = BenchResult(b2.NAME, config_dict(cfg, **asdict(wl2), shared_with=NAME))
    res.comparisons.append(b2.compare(worker, base, wl2, cfg.reps, cfg.seed))
    fill_sides(res, worker, base)
    res.notes.append("ran on B1's worker and baseline (same device page budget)")
    res.wall_s = time.perf_counter() - started
    res.print()
    print(f"  wrote {res.write()}")


def main(argv: list[str] | None = None) -> int:
    a, wl = parse(argv)
    cfg = BenchConfig(model=a.model, quick=a.quick, reps=a.reps, dtype=a.dtype, seed=a.seed)
    started = time.perf_counter()
    block_size = 128  # vLLM-CPU's block size; checked against both engines below
    num_pages, n_hot = wl.pages(block_size)
    max_len = wl.doc_tokens + wl.question_tokens + wl.out_tokens + 8
    max_len = max(512, -(-max_len // 128) * 128)
    opts = WorkerOptions(
        model=cfg.model,
        num_pages=num_pages,
        dtype=cfg.dtype,
        max_model_len=max_len,
        max_num_seqs=wl.in_flight,
        host_pages=wl.docs * (wl.doc_tokens // block_size + 2),
    )
    result = BenchResult(NAME, config_dict(cfg, **asdict(wl), device_pages=num_pages, pinned_hot_docs=n_hot))
    docs = [random_tokens(wl.doc_tokens, cfg.seed, 1, i) for i in range(wl.docs)]
    worker = WorkerProcess(opts)
    b3_worker = None
    if a.with_b3:
        from bench import b3_pred_overhead as b3

        # Started now so its vLLM loads while this process loads the baseline (it idles after).
        b3_worker = WorkerProcess(b3.worker_options(cfg))
    try:
        extra = {"kv_offloading_size": a.vllm_offload_gib} if a.vllm_offload_gib else {}
        # Equal KV bytes (the protocol): the worker's host tier is the same DRAM on a CPU host, so
        # vLLM gets device + host pages; with its CPU offload (a GPU), the offload stands for it.
        blocks = num_pages if extra else baseline_blocks(opts)
        base = VLLMBaseline(
            cfg.model, blocks, dtype=cfg.dtype, max_num_seqs=wl.in_flight, max_model_len=max_len, **extra
        )
        result.config["baseline"] = f"vLLM APC + CPU offload {a.vllm_offload_gib} GiB" if extra else "vLLM APC"
        worker.wait_ready()
        health = worker.admin.health()
        if base.block_size != block_size or health["block_size"] != block_size:
            result.notes.append(f"block size vLLM {base.block_size}, worker {health['block_size']} != {block_size}")
        sym = SymphonyRag(worker, wl, docs)
        ingest = Comparison("ingest all documents", "s", higher_is_better=False)
        with worker.sample_pages():
            ingest.symphony.add(sym.ingest())
            ingest.baseline.add(base.generate(docs, 1).elapsed_s)
            result.comparisons.append(ingest)
            print("  " + ingest.line(), flush=True)
            for alpha in wl.alphas:
                sym.pin_hot(hottest_docs(wl.docs, n_hot, alpha, cfg.seed))
                cmp = Comparison(f"alpha {alpha}", "req/s")
                cached: list[float] = []
                distinct: list[int] = []
                for i in range(cfg.reps):
                    repetition_starts()
                    # Each repetition serves its own stretch of the request stream (and its own
                    # questions): replaying one stretch let vLLM's cache hold exactly its docs.
                    trace = pareto_trace(wl.docs, wl.requests, alpha, cfg.seed, part=i)
                    questions = [
                        random_tokens(wl.question_tokens, cfg.seed, 2, int(alpha * 1000), i, r)
                        for r in range(wl.requests)
                    ]
                    prompts = [docs[d] + q for d, q in zip(trace, questions, strict=True)]
                    distinct.append(len(set(trace)))

                    def vllm_side(prompts: list[list[int]] = prompts, cached: list[float] = cached) -> float:
                        st = base.generate(prompts, wl.out_tokens)
                        cached.append(st.cached_prompt_tokens / st.prompt_tokens)
                        return st.requests_per_s

                    sides = [(lambda t=trace, q=questions: sym.serve(t, q), cmp.symphony), (vllm_side, cmp.baseline)]
                    for fn, sample in sides if i % 2 == 0 else reversed(sides):
                        sample.add(fn())
                cmp.extra.update(
                    alpha=alpha,
                    distinct_docs=distinct,
                    vllm_prompt_cache_hit=cached,
                    target=">= 7x where skew matters, >= 1x at every alpha",
                )
                result.comparisons.append(cmp)
                print("  " + cmp.line(), flush=True)
        fill_sides(result, worker, base)
        if a.with_b2:
            run_b2_here(worker, base, cfg, time.perf_counter())
        result.memory = worker.memory()
        result.memory["kv_files"] = len(worker.admin.kv_list(TENANT))
        if not extra:
            result.notes.append(
                "baseline without vLLM's CPU KV offload: vllm 0.32 offers it on CUDA/XPU only; "
                "--vllm-offload-gib N adds it on a GPU (bench/README.md)"
            )
        base.close()

    except BaseException:
        if b3_worker is not None:
            b3_worker.close()
        raise
    finally:
        worker.close()
    result.wall_s = time.perf_counter() - started
    result.print()
    print(f"  wrote {result.write()}")
    if b3_worker is not None:
        import gc

        gc.collect()  # the baseline's engine must be gone before B3 creates the bare one
        b3.run(cfg, b3_worker, time.perf_counter())
    return 0


if __name__ == "__main__":
    sys.exit(main())
