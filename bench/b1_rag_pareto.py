"""B1 v2 — RAG over a Pareto-popular corpus larger than either side's KV: an online retention
policy in the LIP (KV files, pins, KVFS tiers) vs vLLM's prefix cache (LRU).

Workload: ``docs`` documents of ``doc_tokens`` tokens; each request picks a document by
Pareto(alpha) popularity (``harness.pareto_trace``), appends a ``question_tokens`` question and
decodes ``out_tokens`` greedy tokens; ``in_flight`` requests run at once. The corpus's KV is
larger than each side's whole KV memory and than both sides' together (the worker's device +
host pages; the baseline gets as many blocks, ``harness.baseline_blocks``), so neither side can
keep every document: what is measured is which documents each keeps, and what a miss costs.

Per alpha, both sides first serve the same untimed warm-up stretch of the request stream
(``warmup_requests``), then each timed repetition serves its own stretch (same ranking, fresh
draws and questions), the two sides interleaved.

Symphony side (the LIP): every document's KV is computed once into a persistent named KV file
(``doc-<i>``). The LIP's retention policy (:class:`FrequencyPins`) knows only what it has served:
it counts requests per document as they complete (from the first warm-up request on, per alpha)
and keeps the ``pin_docs`` most requested pinned, re-pinning when the counts change the order;
every other file is left to KVFS, which spills idle unpinned files device -> host -> disk under
pressure and reloads them on ``kv_open`` instead of recomputing. Each request opens its document
read-only (a copy-on-write fork: the question goes to a fresh page), decodes, and closes the
fork. ``in_flight`` LIP sessions of one tenant run concurrently, as ``in_flight`` threads.

Baseline: vLLM ``LLM.generate`` of the same prompts (document + question, same order) with
automatic prefix caching, as many KV blocks as the worker has device + host pages, max batch
``in_flight``. Both sides ingest every document once before anything is timed (vLLM: a 1-token
generate per document).

Figure: requests/s at each alpha, ratio Symphony ÷ vLLM (target >= 7x where skew matters, >= 1x
everywhere) with the ratio's ceiling on this hardware beside it (``results.b1_ceiling``), plus
the one-off ingestion time of both sides.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from bench import results
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
    pareto_trace,
    random_tokens,
    repetition_starts,
    share_out,
    stopwatch,
)
from bench.resources import dtype_bytes, kv_geometry, kv_page_bytes

NAME = "b1_rag_pareto_v2"
TENANT = "bench-b1"
#: vLLM-CPU's block size and the worker's page size (checked against both engines at start).
BLOCK_SIZE = 128
#: The warm-up stretch's ``part`` of the request stream; timed repetition ``i`` serves ``i + 1``.
WARMUP_PART = 0
GIB = 1 << 30


@dataclass(frozen=True)
class Workload:
    """Sizes of one B1 v2 run (defaults: bench/README.md, "B1", why these sizes)."""

    docs: int = 32
    doc_tokens: int = 1024
    question_tokens: int = 32
    out_tokens: int = 16
    #: Timed requests a repetition.
    requests: int = 16
    #: Untimed requests served by both sides at the start of each alpha (the policy's first counts).
    warmup_requests: int = 16
    in_flight: int = 4
    #: The LIP's pin budget, in documents (device pages it may keep pinned).
    pin_docs: int = 4
    #: The worker's host tier, in documents' pages.
    host_docs: int = 6
    alphas: tuple[float, ...] = (0.5, 1.0, 2.0, 3.0)

    def doc_pages(self, block_size: int) -> int:
        return -(-self.doc_tokens // block_size)

    def pages(self, block_size: int) -> tuple[int, int]:
        """(device pages incl. page 0, host pages): the pinned documents, plus one reloaded
        document and its private tail pages per in-flight request; the host tier."""
        doc = self.doc_pages(block_size)
        tail = -(-(self.doc_tokens + self.question_tokens + self.out_tokens) // block_size) - doc
        return 1 + self.pin_docs * doc + self.in_flight * (doc + tail), self.host_docs * doc

    def corpus_pages(self, block_size: int) -> int:
        return self.docs * self.doc_pages(block_size)


QUICK = Workload(
    docs=12,
    doc_tokens=256,
    question_tokens=16,
    out_tokens=4,
    requests=16,
    warmup_requests=8,
    in_flight=4,
    pin_docs=2,
    host_docs=2,
    alphas=(0.5, 3.0),
)


class FrequencyPins:
    """The LIP's online retention policy: pin the ``budget`` documents requested most so far.

    It sees only the requests it has served (no popularity ranking from the generator). Ties
    keep what is pinned (a newcomer must be requested more, not as often, to displace a pinned
    document, so equal counts do not churn pins), then the document seen first.
    """

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.counts: Counter[int] = Counter()
        self.first_seen: dict[int, int] = {}
        self.pinned: set[int] = set()

    def observe(self, doc: int) -> None:
        self.first_seen.setdefault(doc, len(self.first_seen))
        self.counts[doc] += 1

    def wanted(self) -> set[int]:
        ranked = sorted(self.counts, key=lambda d: (-self.counts[d], d not in self.pinned, self.first_seen[d]))
        return set(ranked[: self.budget])

    def changes(self) -> tuple[set[int], set[int]]:
        """(to unpin, to pin) to reach :meth:`wanted`; the caller applies them, then
        :meth:`applied`."""
        want = self.wanted()
        return self.pinned - want, want - self.pinned

    def applied(self, unpinned: set[int], pinned: set[int]) -> None:
        self.pinned = (self.pinned - unpinned) | pinned


class SymphonyRag:
    """The RAG LIP's side: persistent document files, an online pinned set, a fork per request."""

    def __init__(self, worker: WorkerProcess, wl: Workload, docs: list[list[int]]) -> None:
        self.worker = worker
        self.wl = wl
        self.docs = docs
        self.sessions = [worker.connect(TENANT) for _ in range(wl.in_flight)]
        self.policy = FrequencyPins(wl.pin_docs)
        self._policy_lock = threading.Lock()
        #: Pin changes made (pins + unpins) since :meth:`start_policy`.
        self.pin_changes = 0

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

    def start_policy(self) -> None:
        """A new workload (alpha): the LIP starts with no counts and nothing pinned."""
        sess = self.sessions[0][0]
        for i in sorted(self.policy.pinned):
            sess.kv_pin(f"doc-{i}", False)
        self.policy = FrequencyPins(self.wl.pin_docs)
        self.pin_changes = 0

    def _count(self, sess: Any, doc: int) -> None:
        """One served request of ``doc``: count it and re-pin if the most requested changed."""
        with self._policy_lock:
            self.policy.observe(doc)
            unpin, pin = self.policy.changes()
            for i in sorted(unpin):  # first, so the pinned pages never pass the budget
                sess.kv_pin(f"doc-{i}", False)
            for i in sorted(pin):
                sess.kv_pin(f"doc-{i}", True)
            self.policy.applied(unpin, pin)
            self.pin_changes += len(unpin) + len(pin)

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
            self._count(sess, trace[r])

        with stopwatch() as t:
            share_out(range(len(trace)), self.wl.in_flight, request)
        return len(trace) / t[0]


def kv_arithmetic(wl: Workload, model: str, dtype: str, device_pages: int, host_pages: int, blocks: int) -> str:
    """The record's note on sizes: one page's bytes from the model's config, each side's KV and
    the corpus's, so a reader can check that the corpus exceeds both sides' KV."""

    def size(n: int) -> str:
        return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / (1 << 20):.1f} MiB"

    layers, heads, head_dim = kv_geometry(model)
    elem = dtype_bytes(model, dtype)
    page = kv_page_bytes(model, dtype, BLOCK_SIZE)
    worker = (device_pages + host_pages) * page
    base = blocks * page
    corpus = wl.corpus_pages(BLOCK_SIZE) * page
    return (
        f"KV arithmetic: one page = 2 (K, V) x {layers} layers x {heads} KV heads x {head_dim} head dim x "
        f"{BLOCK_SIZE} tokens x {elem} B ({dtype}) = {page:,} B ({page / (1 << 20):.2f} MiB); a "
        f"{wl.doc_tokens}-token document = {wl.doc_pages(BLOCK_SIZE)} pages. Worker: {device_pages} device pages "
        f"(page 0 reserved) + {host_pages} host pages = {size(worker)}; vLLM: {blocks} blocks = {size(base)}; both "
        f"sides {size(worker + base)}. Corpus: {wl.docs} documents = {wl.corpus_pages(BLOCK_SIZE)} pages "
        f"= {size(corpus)}, {corpus / worker:.2f}x either side's KV and {corpus / (worker + base):.2f}x "
        "both together."
    )


def ceiling(cmp: Comparison, ingest: Comparison, config: dict[str, Any]) -> float | None:
    """B1's ceiling for one alpha row, by the rule RESULTS.md uses (``results.b1_ceiling``)."""
    return results.b1_ceiling(cmp.to_dict(), {"config": config, "comparisons": [ingest.to_dict()]})


INT_SIZES = (
    "docs",
    "doc_tokens",
    "question_tokens",
    "out_tokens",
    "requests",
    "warmup_requests",
    "in_flight",
    "pin_docs",
    "host_docs",
)


def parse(argv: list[str] | None) -> tuple[argparse.Namespace, Workload]:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default=None)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--reps", type=int, default=MIN_REPS)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--seed", type=int, default=0)
    for f in INT_SIZES:
        p.add_argument("--" + f.replace("_", "-"), type=int, default=None)
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
    changes: dict[str, Any] = {f: getattr(a, f) for f in INT_SIZES if getattr(a, f) is not None}
    if a.alphas:
        changes["alphas"] = tuple(float(x) for x in a.alphas.split(","))
    wl = Workload(**{**asdict(wl), **changes})
    device, host = wl.pages(BLOCK_SIZE)
    if wl.corpus_pages(BLOCK_SIZE) <= device + host:
        p.error(
            f"the corpus ({wl.corpus_pages(BLOCK_SIZE)} pages) must exceed each side's KV ({device} device + "
            f"{host} host pages): B1 v2 measures which documents each side keeps, not whether all fit"
        )
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
    device_pages, host_pages = wl.pages(BLOCK_SIZE)
    max_len = wl.doc_tokens + wl.question_tokens + wl.out_tokens + 8
    max_len = max(512, -(-max_len // 128) * 128)
    opts = WorkerOptions(
        model=cfg.model,
        num_pages=device_pages,
        dtype=cfg.dtype,
        max_model_len=max_len,
        max_num_seqs=wl.in_flight,
        host_pages=host_pages,
        # One tenant: the pin budget is the workload's (pin_docs), not a share of other tenants'.
        kv_pinned_fraction=1.0,
    )
    result = BenchResult(
        NAME,
        config_dict(
            cfg,
            **asdict(wl),
            device_pages=device_pages,
            host_pages=host_pages,
            corpus_pages=wl.corpus_pages(BLOCK_SIZE),
            pin_policy="online: the pin_docs most requested so far (warm-up + timed), re-pinned as counts change",
        ),
    )
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
        blocks = device_pages if extra else baseline_blocks(opts)
        base = VLLMBaseline(
            cfg.model, blocks, dtype=cfg.dtype, max_num_seqs=wl.in_flight, max_model_len=max_len, **extra
        )
        result.config["baseline"] = f"vLLM APC + CPU offload {a.vllm_offload_gib} GiB" if extra else "vLLM APC"
        worker.wait_ready()
        health = worker.admin.health()
        if base.block_size != BLOCK_SIZE or health["block_size"] != BLOCK_SIZE:
            result.notes.append(f"block size vLLM {base.block_size}, worker {health['block_size']} != {BLOCK_SIZE}")
        result.notes.append(kv_arithmetic(wl, cfg.model, cfg.dtype, device_pages, host_pages, base.num_blocks))
        print("  " + result.notes[-1], flush=True)
        sym = SymphonyRag(worker, wl, docs)
        ingest = Comparison("ingest all documents", "s", higher_is_better=False)
        with worker.sample_pages():
            ingest.symphony.add(sym.ingest())
            ingest.baseline.add(base.generate(docs, 1).elapsed_s)
            result.comparisons.append(ingest)
            print("  " + ingest.line(), flush=True)
            for alpha in wl.alphas:
                result.comparisons.append(measure_alpha(sym, base, wl, cfg, alpha, docs, ingest, result.config))
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


def stretch(wl: Workload, cfg: BenchConfig, alpha: float, part: int, n: int) -> tuple[list[int], list[list[int]]]:
    """``n`` requests of the stream's stretch ``part``: document per request, and questions."""
    trace = pareto_trace(wl.docs, n, alpha, cfg.seed, part=part)
    questions = [random_tokens(wl.question_tokens, cfg.seed, 2, int(alpha * 1000), part, r) for r in range(n)]
    return trace, questions


def measure_alpha(
    sym: SymphonyRag,
    base: VLLMBaseline,
    wl: Workload,
    cfg: BenchConfig,
    alpha: float,
    docs: list[list[int]],
    ingest: Comparison,
    config: dict[str, Any],
) -> Comparison:
    """One alpha: the LIP's policy starts afresh, both sides serve the untimed warm-up stretch,
    then ``cfg.reps`` timed stretches, the sides interleaved."""
    sym.start_policy()
    cmp = Comparison(f"alpha {alpha}", "req/s")
    warm_trace, warm_questions = stretch(wl, cfg, alpha, WARMUP_PART, wl.warmup_requests)
    warmup = {"symphony": wl.warmup_requests / sym.serve(warm_trace, warm_questions)}
    warm_prompts = [docs[d] + q for d, q in zip(warm_trace, warm_questions, strict=True)]
    warmup["baseline"] = base.generate(warm_prompts, wl.out_tokens).elapsed_s
    pins_after_warmup = sym.pin_changes
    cached: list[float] = []
    distinct: list[int] = []
    for i in range(cfg.reps):
        repetition_starts()
        trace, questions = stretch(wl, cfg, alpha, WARMUP_PART + 1 + i, wl.requests)
        prompts = [docs[d] + q for d, q in zip(trace, questions, strict=True)]
        distinct.append(len(set(trace)))

        def vllm_side(prompts: list[list[int]] = prompts) -> float:
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
        warmup_s=warmup,
        pin_changes={"warmup": pins_after_warmup, "timed": sym.pin_changes - pins_after_warmup},
        pinned_at_end=sorted(sym.policy.pinned),
        target=">= 7x where skew matters, >= 1x at every alpha",
    )
    top = ceiling(cmp, ingest, config)
    print(f"  {cmp.line()}  ceiling here {'-' if top is None else f'~{top:.2f}'}", flush=True)
    return cmp


if __name__ == "__main__":
    sys.exit(main())
