"""B4 — parallel decode: one prompt, ``branches`` sampled continuations; ``kv_fork`` vs vLLM ``n``.

Symphony side: one LIP session prefills the prompt once (``pred`` → a Dist), samples a distinct
first token per branch from it (seeds ``seed, b``), ``kv_fork``s the prompt's KV ``branches``
times and decodes each fork in its own thread with fused ``pred(..., then=sample)`` and a fixed
seed per (branch, step). The forks share every prompt page copy-on-write; with a prompt that
ends on a page boundary each branch's first token goes to a fresh page, so the LIP's device
pages must be ``prefix pages + branches x new pages`` — no full page copied. The LIP reads that
from the worker's ``stats`` (``kvfs.pages_per_tenant``) after every branch has decoded and
before any fork is closed, and the run fails if it is larger.

A second row runs the same LIP written with its branches in lock-step: one thread steps all
forks at once with ``pred_token_many`` (one write of ``branches`` calls per step, unseeded
sampling), as B2's lock-step row does: same forwards, one round trip a step instead of one per
branch.

Baseline: one ``LLM.generate(prompt, SamplingParams(n=branches, temperature, seed))`` with
automatic prefix caching and as many KV blocks as the worker has pages.

Figure: output tokens/s (branches * out_tokens / wall, prefill included on both sides).
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from typing import Any

from bench.baseline_vllm import VLLMBaseline
from bench.harness import (
    BenchConfig,
    BenchResult,
    Comparison,
    WorkerOptions,
    WorkerProcess,
    max_len_for,
    random_tokens,
    repetition_starts,
    run_standalone,
    run_threads,
    stopwatch,
    workload_args,
)

NAME = "b4_parallel_decode"
TENANT = "bench-b4"


@dataclass(frozen=True)
class Workload:
    """Sizes of one B4 run (defaults: the spec)."""

    prompt_tokens: int = 1024
    branches: int = 8
    out_tokens: int = 128
    temperature: float = 1.0

    def expected_pages(self, block_size: int) -> int:
        """Device pages the LIP should hold with every branch decoded: the prompt's pages once,
        plus per branch the pages past the prompt's last *full* page (a shared partial last page
        is copied once per branch on its first append — that copy is allowed, a full one is not).
        The last sampled token of a branch is never appended, hence ``out_tokens - 1``."""
        full, prefix = self.prompt_tokens // block_size, -(-self.prompt_tokens // block_size)
        per_branch = -(-(self.prompt_tokens + self.out_tokens - 1) // block_size) - full
        return prefix + self.branches * per_branch

    def copied_pages(self, block_size: int) -> int:
        """What the same LIP would hold if a fork copied the whole prompt."""
        prefix = -(-self.prompt_tokens // block_size)
        return prefix + self.branches * -(-(self.prompt_tokens + self.out_tokens - 1) // block_size)

    def pages(self, block_size: int) -> int:
        """Device budget of both sides: page 0, the expected pages and one spare page per branch."""
        return 1 + self.expected_pages(block_size) + self.branches


QUICK = Workload(prompt_tokens=128, branches=4, out_tokens=8)


def held_pages(worker) -> int:
    """Device pages the LIP's files hold: the tenant's pages less those only the prefix cache
    keeps (an earlier repetition's pages, reclaimed first; the only tenant here is the LIP's)."""
    kvfs = worker.stats()["kvfs"]
    return kvfs["pages_per_tenant"].get(TENANT, 0) - kvfs.get("prefix_cached_pages", 0)


@dataclass
class PageCheck:
    """Device pages the LIP held at its widest point vs what copy-on-write forking predicts."""

    measured: int
    expected: int
    if_copied: int

    @property
    def ok(self) -> bool:
        return self.measured <= self.expected


def symphony_side(
    worker: WorkerProcess, wl: Workload, prompt: list[int], seed: int, checks: list[PageCheck], lockstep: bool = False
) -> float:
    """Output tokens/s of the fork-and-decode LIP (a thread per branch, or ``lockstep``: all
    branches stepped by one ``pred_token_many`` a token); appends the page accounting to ``checks``."""
    sess, sid = worker.connect(TENANT)
    block = int(worker.admin.health()["block_size"])
    n, t = wl.branches, wl.temperature
    decoded = threading.Barrier(n + 1)  # the threaded LIP's widest point
    release = threading.Event()

    def branch(kv: Any, b: int, first: int) -> int:
        tok = first
        for step in range(1, wl.out_tokens):
            tok = sess.pred_token(kv, [tok], temperature=t, seed=seed * 1_000_003 + b * 10_007 + step)
        decoded.wait()  # all branches at full length: the LIP's widest point
        release.wait()
        sess.kv_close(kv)
        return wl.out_tokens

    try:
        with stopwatch() as elapsed:
            root = sess.kv_create()
            with sess.pred(root, prompt)[0] as dist:
                firsts = [dist.sample(temperature=t, seed=seed * 1_000_003 + b * 10_007) for b in range(n)]
            forks = [sess.kv_fork(root) for _ in range(n)]
            threads_done: list[int] = []
            if lockstep:
                toks = firsts
                for _ in range(1, wl.out_tokens):
                    toks = sess.pred_token_many([(kv, [tok]) for kv, tok in zip(forks, toks, strict=True)], t)
                pages = held_pages(worker)
                for kv in forks:
                    sess.kv_close(kv)
                threads_done = [wl.out_tokens] * n  # tokens per branch, as the threads return
            else:
                runner = threading.Thread(
                    target=lambda: threads_done.extend(
                        run_threads([lambda b=b: branch(forks[b], b, firsts[b]) for b in range(n)])
                    ),
                    daemon=True,
                )
                runner.start()
                decoded.wait()
                pages = held_pages(worker)
                release.set()
                runner.join()
            sess.kv_close(root)
        checks.append(PageCheck(pages, wl.expected_pages(block), wl.copied_pages(block)))
        return sum(threads_done) / elapsed[0]
    finally:
        release.set()
        worker.end(sess, sid)


def baseline_side(base: VLLMBaseline, wl: Workload, prompt: list[int], seed: int, cached: list[float]) -> float:
    """Output tokens/s of vLLM's ``n=branches`` sampling of the same prompt."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(
        n=wl.branches, temperature=wl.temperature, seed=seed, max_tokens=wl.out_tokens, ignore_eos=True
    )
    with stopwatch() as elapsed:
        (out,) = base.llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)
    cached.append((out.num_cached_tokens or 0) / len(prompt))
    return sum(len(c.token_ids) for c in out.outputs) / elapsed[0]


def run(worker: WorkerProcess, base: VLLMBaseline, cfg: BenchConfig, wl: Workload, result: BenchResult) -> None:
    """Interleaved reps (a fresh prompt per rep: neither side may serve it from its cache)."""
    cmp = Comparison(f"parallel decode n={wl.branches}", "tok/s")
    lock = Comparison(f"parallel decode n={wl.branches} (branches in lock-step)", "tok/s")
    checks: list[PageCheck] = []
    cached: list[float] = []
    for i in range(cfg.reps):
        repetition_starts()
        prompt = random_tokens(wl.prompt_tokens, cfg.seed, 5, i)
        vllm_tps: list[float] = []
        sides = [
            (lambda p=prompt, i=i: cmp.symphony.add(symphony_side(worker, wl, p, cfg.seed + i, checks))),
            (lambda p=prompt, i=i: lock.symphony.add(symphony_side(worker, wl, p, cfg.seed + i, checks, True))),
            (lambda p=prompt, i=i, out=vllm_tps: out.append(baseline_side(base, wl, p, cfg.seed + i, cached))),
        ]
        for fn in sides if i % 2 == 0 else reversed(sides):
            fn()
        cmp.baseline.add(vllm_tps[0])
        lock.baseline.add(vllm_tps[0])  # one vLLM run per repetition serves both rows
    for row in (cmp, lock):
        row.extra.update(
            target=">= 1.3x vLLM n=8 tokens/s",
            lip_device_pages=[c.measured for c in checks],
            expected_pages_cow=checks[0].expected,
            pages_if_fork_copied=checks[0].if_copied,
            vllm_prompt_cache_hit=cached,
        )
        result.comparisons.append(row)
    bad = [c for c in checks if not c.ok]
    if bad:
        raise AssertionError(f"kv_fork copied pages: LIP held {bad[0].measured} pages > expected {bad[0].expected}")
    result.notes.append(
        f"LIP device pages at full width {checks[0].measured} = prefix + {wl.branches} x new "
        f"(expected {checks[0].expected}; {checks[0].if_copied} if forks copied the prompt)"
    )


def main(argv: list[str] | None = None) -> int:
    cfg, wl = workload_args(argv, __doc__ or NAME, Workload(), QUICK)
    opts = WorkerOptions(
        model=cfg.model,
        num_pages=wl.pages(128),
        dtype=cfg.dtype,
        max_model_len=max_len_for(wl.prompt_tokens + wl.out_tokens),
        max_num_seqs=wl.branches,
    )
    run_standalone(NAME, cfg, wl, opts, lambda w, b, r: run(w, b, cfg, wl, r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
