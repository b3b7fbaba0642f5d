"""B10 — Graph-of-Thought: k thoughts per level scored by log-probability, the best two merged
and refined, several levels; a LIP on forked KV vs a client loop over ``vllm serve``.

Workload, per graph: a ``prompt_tokens`` shared prompt; then ``levels``
times: ``branches`` thoughts, each a ``seed_tokens`` seed of its own followed by
``thought_tokens`` greedy tokens, scored by their mean log-probability; the best two are merged
(best thought, then the second's seed and thought) and ``refine_tokens`` greedy tokens are
generated after a ``refine_prompt_tokens`` refine prompt; the next level starts from that
refined context. ``graphs`` graphs a repetition, ``in_flight`` at a time. Every length is fixed
(greedy, EOS ignored), so both sides compute the same tokens whatever thoughts win; all token
ids are drawn from fixed seeds, fresh for each repetition (no side is served from a cache a
previous repetition filled).

Symphony side: each graph is one LIP session running :func:`run_graph` of
``examples/graph_of_thought.py`` (the example itself, socket only: the LIP as threads of this
process, like B6): the prompt is computed once, each thought is a ``kv_fork`` of the context
decoded in its own thread (``pred`` + ``Dist.topk(1)`` a token: the greedy token and its
log-probability), the merge is ``kv_extract`` of the second thought's tokens + ``kv_merge``
after the best (only those tokens are recomputed, at their new positions), and the refine
decodes on the merged file.

Baseline (``vllm serve`` with automatic prefix caching, same model, dtype, KV blocks, batch and
length limits): one client thread per graph, doing the same graph with ``/v1/completions``: a
level's thoughts are ``branches`` concurrent requests (``logprobs=1``), each re-sending the
context and its seed; the merge is a request whose prompt concatenates context, best thought,
second thought and refine prompt. The prefix cache serves what it holds in full 128-token
blocks; the rest is recomputed.

Figures: graphs/s (the ratio), and tokens computed per graph on each side: Symphony's from the
worker's per-tenant count of tokens its forwards computed (a merged file's recomputed tokens
included), less the sessions' ``decode_tokens``, vLLM's from each reply's
``prompt_tokens - cached_tokens`` (``--enable-prompt-tokens-details``) plus its decode steps.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from types import ModuleType
from typing import Any

from bench.baseline_server import Completion, VLLMServer
from bench.harness import (
    ROOT,
    BenchConfig,
    BenchResult,
    Comparison,
    WorkerOptions,
    WorkerProcess,
    baseline_blocks,
    config_dict,
    fill_sides,
    max_len_for,
    random_tokens,
    repetition_starts,
    run_threads,
    share_out,
    stopwatch,
    workload_args,
)

NAME = "b10_got"
TENANT = "bench-b10"
#: Target (the paper's upper Graph-of-Thought figure over vLLM).
TARGET = 1.43


@dataclass(frozen=True)
class Workload:
    """Sizes of one B10 run (defaults: k=4, 3 levels)."""

    graphs: int = 8
    in_flight: int = 4
    branches: int = 4
    levels: int = 3
    prompt_tokens: int = 512
    seed_tokens: int = 4
    thought_tokens: int = 32
    refine_prompt_tokens: int = 8
    refine_tokens: int = 32
    #: Both sides' OpenMP wait policy (the protocol: the same on both): 1 ``PASSIVE`` (the
    #: worker's own default, gpu_worker/__main__.py), 0 ``ACTIVE`` (threads spin at barriers).
    omp_passive: int = 1

    def context_tokens(self) -> int:
        """A graph's longest context: prompt + per level two thoughts, refine prompt, refine."""
        per_level = 2 * (self.seed_tokens + self.thought_tokens) + self.refine_prompt_tokens + self.refine_tokens
        return self.prompt_tokens + self.levels * per_level

    def pages(self, block_size: int) -> int:
        """Device pages = vLLM blocks: per graph in flight its context twice (a level's context
        and the merged file) and per branch a copied partial page and a new one, plus page 0."""
        ctx = -(-self.context_tokens() // block_size)
        return 1 + self.in_flight * (2 * ctx + 2 * self.branches + 2)


QUICK = Workload(
    graphs=2,
    in_flight=2,
    levels=2,
    prompt_tokens=64,
    seed_tokens=2,
    thought_tokens=4,
    refine_prompt_tokens=2,
    refine_tokens=4,
)


@dataclass(frozen=True)
class Graph:
    """One graph's token ids: its prompt and per level the seeds and the refine prompt."""

    prompt: list[int]
    levels: list[tuple[list[list[int]], list[int]]]


def graphs_for(wl: Workload, seed: int, rep: int) -> list[Graph]:
    return [
        Graph(
            prompt=random_tokens(wl.prompt_tokens, seed, 10, rep, g),
            levels=[
                (
                    [random_tokens(wl.seed_tokens, seed, 11, rep, g, lv, b) for b in range(wl.branches)],
                    random_tokens(wl.refine_prompt_tokens, seed, 12, rep, g, lv),
                )
                for lv in range(wl.levels)
            ],
        )
        for g in range(wl.graphs)
    ]


@dataclass
class Outcome:
    """What one side's graphs did: per graph and level the chosen pair, and the token work."""

    chosen: list[list[tuple[int, int]]] = field(default_factory=list)
    computed_tokens: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    prompt_tokens_sent: int = 0


def load_example() -> ModuleType:
    """``examples/graph_of_thought.py``: the LIP this benchmark runs is the example itself."""
    spec = importlib.util.spec_from_file_location("graph_of_thought_example", ROOT / "examples" / "graph_of_thought.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------------------- Symphony
def symphony_side(worker: WorkerProcess, got: ModuleType, wl: Workload, graphs: list[Graph]) -> tuple[float, Outcome]:
    """(graphs/s, outcome): one LIP session per graph, ``in_flight`` graphs at a time."""

    def one(_: int, g: Graph) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        sess, sid = worker.connect(TENANT)
        try:
            levels = got.run_graph(sess, g.prompt, g.levels, wl.thought_tokens, wl.refine_tokens)
        finally:
            usage = worker.end(sess, sid)
        return levels, usage

    before = computed_tokens(worker)
    with stopwatch() as t:
        done = share_out(graphs, wl.in_flight, one)
    out = Outcome()
    for levels, usage in done:
        out.chosen.append([(lv["chosen"][0], lv["chosen"][1]) for lv in levels])
        out.decode_tokens += int(usage["decode_tokens"])
    # A session's usage counts the tokens its calls sent; a merged file's recomputed tokens (the
    # second thought's, pending in the file) go into the forward too but are not in any call:
    # the scheduler's per-tenant count of tokens computed has them. Every multi-token append
    # here carries the refine prompt, so the single-token appends are exactly the decode steps.
    out.computed_tokens = computed_tokens(worker) - before
    out.prefill_tokens = out.computed_tokens - out.decode_tokens
    return len(graphs) / t[0], out


def computed_tokens(worker: WorkerProcess) -> int:
    """Tokens the worker's forwards computed for this benchmark's tenant so far."""
    return int(worker.stats()["scheduler"].get("tokens_per_tenant", {}).get(TENANT, 0))


# ---------------------------------------------------------------------------- baseline
@dataclass
class _Tally:
    prefill: int = 0
    decode: int = 0
    sent: int = 0

    def add(self, prompt: list[int], c: Completion) -> None:
        if c.cached_tokens < 0:
            raise RuntimeError("vllm serve did not report cached prompt tokens")
        self.prefill += c.prompt_tokens - c.cached_tokens
        self.decode += len(c.ids) - 1  # the first generated token comes out of the prefill
        self.sent += len(prompt)


def serve_graph(server: VLLMServer, wl: Workload, g: Graph) -> tuple[list[tuple[int, int]], _Tally]:
    """One graph as a client loop: every call re-sends its whole context."""
    clients = [server.client() for _ in range(wl.branches)]
    tally = _Tally()
    chosen: list[tuple[int, int]] = []
    ctx = list(g.prompt)
    try:
        for seeds, refine in g.levels:
            prompts = [ctx + s for s in seeds]
            pairs = zip(clients, prompts, strict=True)
            calls = [functools.partial(c.completion, p, wl.thought_tokens, 1) for c, p in pairs]
            outs: list[Completion] = run_threads(calls)
            for p, out in zip(prompts, outs, strict=True):
                tally.add(p, out)
            scores = [sum(o.logprobs) / len(o.logprobs) for o in outs]
            best, second = sorted(range(wl.branches), key=lambda b: (-scores[b], b))[:2]
            chosen.append((best, second))
            merged = ctx + seeds[best] + outs[best].ids + seeds[second] + outs[second].ids + refine
            refined = clients[0].completion(merged, wl.refine_tokens)
            tally.add(merged, refined)
            ctx = merged + refined.ids
    finally:
        for client in clients:
            client.close()
    return chosen, tally


def serve_side(server: VLLMServer, wl: Workload, graphs: list[Graph]) -> tuple[float, Outcome]:
    with stopwatch() as t:
        done = share_out(graphs, wl.in_flight, lambda _, g: serve_graph(server, wl, g))
    out = Outcome()
    for chosen, tally in done:
        out.chosen.append(chosen)
        out.prefill_tokens += tally.prefill
        out.decode_tokens += tally.decode
        out.prompt_tokens_sent += tally.sent
    out.computed_tokens = out.prefill_tokens + out.decode_tokens
    return len(graphs) / t[0], out


# ------------------------------------------------------------------------------- run
#: OpenMP's wait policy, per process: libgomp's default spins at every barrier of a parallel
#: region before it sleeps. On a CPU host other work also uses, the worker's forward spent most
#: of its time there (NOTES.md, B10): ``PASSIVE`` makes a waiting thread yield its core.
PASSIVE = {"OMP_WAIT_POLICY": "PASSIVE"}


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """Start subprocesses with ``values`` set (they copy ``os.environ``), then restore it."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run(
    worker: WorkerProcess,
    servers: dict[str, VLLMServer],
    cfg: BenchConfig,
    wl: Workload,
    result: BenchResult,
) -> None:
    """Interleaved repetitions (S, B, then B, S), each on fresh graphs. ``servers``: one,
    ``"baseline"`` (vllm serve with the worker's CPUs, forward threads and OpenMP wait policy)."""
    got = load_example()
    title = f"got k={wl.branches} x {wl.levels} levels, {wl.in_flight} graphs in flight"
    rates = {"baseline": Comparison(f"{title} vs vllm serve", "graphs/s")}
    prefill = Comparison("tokens prefilled per graph", "tok", higher_is_better=False)
    computed = Comparison("tokens computed per graph", "tok", higher_is_better=False)
    agree: list[float] = []
    sent: list[float] = []
    # One untimed graph a side first: vLLM's first requests and the worker's first forwards are
    # slower (warm-up), and the first repetition would carry that alone.
    warm = graphs_for(replace(wl, graphs=1), cfg.seed, 1_000)
    symphony_side(worker, got, wl, warm)
    for server in servers.values():
        serve_side(server, wl, warm)
    print(f"  b10: warmed up every side ({time.strftime('%H:%M:%S')})", flush=True)
    for i in range(cfg.reps):
        repetition_starts()
        graphs = graphs_for(wl, cfg.seed, i)
        outcomes: dict[str, Outcome] = {}
        sides: list[tuple[str, Callable[[], tuple[float, Outcome]]]] = [
            ("symphony", functools.partial(symphony_side, worker, got, wl, graphs))
        ]
        sides += [(key, functools.partial(serve_side, server, wl, graphs)) for key, server in servers.items()]
        for key, fn in sides if i % 2 == 0 else list(reversed(sides)):
            r, outcomes[key] = fn()
            if key == "symphony":
                for row in rates.values():
                    row.symphony.add(r)
            else:
                rates[key].baseline.add(r)
            print(f"  b10: rep {i} {key} {r:.4f} graphs/s ({time.strftime('%H:%M:%S')})", flush=True)
        for side, key in (("symphony", "symphony"), ("baseline", "baseline")):
            getattr(prefill, side).add(outcomes[key].prefill_tokens / wl.graphs)
            getattr(computed, side).add(outcomes[key].computed_tokens / wl.graphs)
        by_graph = zip(outcomes["symphony"].chosen, outcomes["baseline"].chosen, strict=True)
        pairs = [(a, b) for sa, sb in by_graph for a, b in zip(sa, sb, strict=True)]
        agree.append(sum(a == b for a, b in pairs) / len(pairs))
        sent.append(outcomes["baseline"].prompt_tokens_sent / wl.graphs)
    policy = f"OMP_WAIT_POLICY={'PASSIVE' if wl.omp_passive else 'ACTIVE'}"
    for row in rates.values():
        row.extra.update(
            target=f">= {TARGET}x graphs/s vs a client loop over vllm serve",
            baseline_kind="vllm serve (prefix caching), one client loop per graph re-sending its context",
            worker_env=policy,
            server_env=policy,
            same_pair_chosen=agree,
            baseline_prompt_tokens_sent_per_graph=sent,
            context_tokens=wl.context_tokens(),
        )
    prefill.extra["note"] = computed.extra["note"] = "work, not speed: lower is less"
    result.comparisons += [*rates.values(), prefill, computed]
    result.notes.append(f"both sides ran with {policy}")
    result.notes.append(
        f"tokens prefilled per graph: Symphony {prefill.symphony.median:.0f}, vLLM {prefill.baseline.median:.0f} "
        f"(the client sent {statistics.median(sent):.0f} prompt tokens per graph); computed in all: "
        f"{computed.symphony.median:.0f} vs {computed.baseline.median:.0f}"
    )
    result.notes.append(
        f"both sides chose the same best two thoughts in {100 * min(agree):.0f}%-{100 * max(agree):.0f}% of "
        "the levels (greedy on both; a near tie may rank apart): the token counts do not depend on it"
    )


def main(argv: list[str] | None = None) -> int:
    cfg, wl = workload_args(argv, __doc__ or NAME, Workload(), QUICK)
    if min(wl.branches - 1, wl.levels, wl.thought_tokens, wl.refine_prompt_tokens, wl.refine_tokens) < 1:
        raise SystemExit("b10: branches >= 2; levels, thought, refine prompt and refine tokens >= 1")
    opts = WorkerOptions(
        model=cfg.model,
        num_pages=wl.pages(128),
        dtype=cfg.dtype,
        max_model_len=max_len_for(wl.context_tokens()),
        max_num_seqs=wl.in_flight * wl.branches,
    )
    started = time.perf_counter()
    result = BenchResult(NAME, config_dict(cfg, **asdict(wl), device_pages=opts.num_pages))

    # Both sides with one OpenMP wait policy (the protocol).
    policy = {"OMP_WAIT_POLICY": "PASSIVE" if wl.omp_passive else "ACTIVE"}
    servers: dict[str, VLLMServer] = {}
    worker: WorkerProcess | None = None
    try:
        with environment(policy):
            worker = WorkerProcess(opts)
        servers["baseline"] = VLLMServer(
            cfg.model,
            baseline_blocks(opts),
            dtype=cfg.dtype,
            max_num_seqs=opts.max_num_seqs,
            max_model_len=opts.max_model_len,
            extra_flags=("--enable-prompt-tokens-details",),
            extra_env=policy,
        )
        for s in servers.values():
            s.wait_ready()
        worker.wait_ready()
        with worker.sample_pages():
            run(worker, servers, cfg, wl, result)
        fill_sides(result, worker, servers["baseline"])
        result.memory = worker.memory()
    finally:
        for s in servers.values():
            s.close()
        if worker is not None:
            worker.close()
    result.wall_s = time.perf_counter() - started
    result.print()
    print(f"  wrote {result.write()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
