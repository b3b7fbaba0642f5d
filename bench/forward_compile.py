"""Decode step time: the worker's Engine (eager or compiled) against vLLM's own LLM.generate.

Not one of the B benchmarks: it answers whether the worker's forward is as fast as vLLM's own
at equal threads. Each side runs in its own child process (vLLM keeps global state; one engine
per process), children are interleaved over the repeats so a busy neighbour on the shared
machine slows every side alike. A child loads the model (the constructor's time is reported:
it includes the compile, or the compile cache's load), prefills ``--context`` tokens per
sequence and then times ``--steps`` decode steps at each batch size:

- ``engine``: :meth:`gpu_worker.engine.Engine.forward` of one new token per sequence, last-row
  logits (what a ``pred`` decode costs the engine thread); ``--compile on|off``.
- ``generate``: ``LLMEngine.step()`` of vLLM's offline engine (its scheduler, runner, sampler and
  detokenizer; greedy, ``ignore_eos``) with vLLM's CPU default compilation.

With ``--prefill N`` each side also times ``--steps`` prefills of a fresh ``N``-token prompt
(no prefix shared, one sequence; the engine's forward of the whole prompt with last-row logits,
vLLM's steps of a one-token request), what a new request's time to first token costs in the
forward.

Both report medians of a step's wall time, of the runner's ``execute_model`` inside it (the
model forward, the same code on both sides) and of the step's process CPU time (both OpenMP
threads: on a loaded machine wall time is mostly waiting for a core, CPU time much less so).
Prints one JSON line per child and a summary.

    .venv/bin/python -m bench.forward_compile [--repeats 3] [--sides engine-eager,engine-compile,generate-compile]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CACHE_DIR = REPO / "var" / "compile-cache"


def _child_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "OMP_NUM_THREADS": str(threads),
            "OMP_WAIT_POLICY": "PASSIVE",
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            "VLLM_CACHE_ROOT": str(CACHE_DIR / "vllm"),
            "TORCHINDUCTOR_CACHE_DIR": str(CACHE_DIR / "inductor"),
            "VLLM_LOGGING_LEVEL": "WARNING",
            # As the Engine sets it (gpu_worker/engine.py): the AOT artifact never loads on CPU.
            "VLLM_USE_AOT_COMPILE": "0",
        }
    )
    return env


def _wrap_execute(runner: Any, times: list[float]) -> None:
    """Time the runner's ``execute_model`` (the forward) into ``times``."""
    inner = runner.execute_model

    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            times.append(time.perf_counter() - t0)

    runner.execute_model = timed


class Turns:
    """Lock-step between the sides running at once: side ``k`` of ``n`` times its step only on
    turns ``k, k + n, ...``, so every side's steps see the same neighbours on a shared machine.

    A counter in a file the sides take turns to bump; a side waiting polls it every 0.5 ms
    (its own step is not being timed then). ``barrier`` waits until every side reached it.
    """

    def __init__(self, directory: str | None, side: int, sides: int) -> None:
        self.dir = Path(directory) if directory else None
        self.side, self.sides = side, sides

    def barrier(self, name: str) -> None:
        if self.dir is None:
            return
        (self.dir / f"{name}.{self.side}").touch()
        while not all((self.dir / f"{name}.{k}").exists() for k in range(self.sides)):
            time.sleep(0.005)

    def _count(self) -> int:
        try:
            return int((self.dir / "turn").read_text() or 0)  # type: ignore[operator]
        except (FileNotFoundError, ValueError):
            return -1

    def wait(self) -> None:
        if self.dir is None:
            return
        while (count := self._count()) < 0 or count % self.sides != self.side:
            time.sleep(0.0005)
        self._turn = count

    def done(self) -> None:
        if self.dir is None:
            return
        tmp = self.dir / f"turn.{self.side}"
        tmp.write_text(str(self._turn + 1))
        tmp.replace(self.dir / "turn")


def _prompt(seq: int, n: int) -> list[int]:
    return [(37 * i + 101 * seq + 11) % 20000 + 100 for i in range(n)]


def _ms(values: list[float]) -> float:
    return round(1000 * statistics.median(values), 2)


def run_engine(args: argparse.Namespace, turns: Turns) -> dict[str, Any]:
    import torch

    from gpu_worker.batch import Batch, SeqWork
    from gpu_worker.engine import Engine, EngineConfig

    t0 = time.perf_counter()
    engine = Engine(
        EngineConfig(
            model_dir=args.model,
            dtype=args.dtype,
            num_pages=256,
            compile=args.compile == "on",
            compile_cache_dir=str(CACHE_DIR),
        )
    )
    start_s = time.perf_counter() - t0
    engine.claim_forward_thread()
    runner = engine._runner
    fwd: list[float] = []
    _wrap_execute(runner, fwd)
    bs = engine.block_size
    per_seq = -(-(args.context + args.steps + 8) // bs)
    result: dict[str, Any] = {"start_s": round(start_s, 1), "threads": torch.get_num_threads(), "batches": {}}
    base = 1
    for b in args.batches:
        seqs = []
        for s in range(b):
            pages = tuple(range(base, base + per_seq))
            base += per_seq
            tokens = _prompt(s, args.context)
            seq_id = f"b{b}s{s}"
            engine.forward(Batch((SeqWork(seq_id, tuple(tokens), 0, pages, (len(tokens) - 1,)),)))
            seqs.append([seq_id, len(tokens), pages])
        step: list[float] = []
        cpu: list[float] = []
        turns.barrier(f"b{b}")
        fwd.clear()
        for i in range(args.warmup + args.steps):
            items = tuple(SeqWork(sid, (1000 + i,), n, pages, (0,)) for sid, n, pages in seqs)
            turns.wait()
            t, c = time.perf_counter(), time.process_time()
            engine.forward(Batch(items))
            turns.done()
            if i >= args.warmup:
                step.append(time.perf_counter() - t)
                cpu.append(time.process_time() - c)
            for seq in seqs:
                seq[1] += 1
        result["batches"][b] = {
            "step_ms": _ms(step),
            "forward_ms": _ms(fwd[args.warmup :]),
            "cpu_ms": _ms(cpu),
        }
        for sid, _, _ in seqs:
            engine.release(sid)
        base = 1
    if args.prefill:
        pages = tuple(range(1, 1 + -(-args.prefill // bs)))
        step, cpu = [], []
        turns.barrier("prefill")
        fwd.clear()
        for i in range(args.warmup + args.steps):
            tokens = _prompt(1000 + i, args.prefill)
            turns.wait()
            t, c = time.perf_counter(), time.process_time()
            engine.forward(Batch((SeqWork(f"p{i}", tuple(tokens), 0, pages, (len(tokens) - 1,)),)))
            turns.done()
            if i >= args.warmup:
                step.append(time.perf_counter() - t)
                cpu.append(time.process_time() - c)
            engine.release(f"p{i}")
        result["prefill"] = {"step_ms": _ms(step), "forward_ms": _ms(fwd[args.warmup :]), "cpu_ms": _ms(cpu)}
    engine.close()
    return result


def run_generate(args: argparse.Namespace, turns: Turns) -> dict[str, Any]:
    import torch
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    t0 = time.perf_counter()
    llm = LLM(
        model=args.model,
        dtype=args.dtype,
        seed=0,
        max_model_len=4097,
        max_num_batched_tokens=2048,
        max_num_seqs=64,
        enable_prefix_caching=False,
        gpu_memory_utilization=0.2,
        num_gpu_blocks_override=256,
        enforce_eager=args.compile == "off",
    )
    start_s = time.perf_counter() - t0
    engine = llm.llm_engine
    runner = engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
    fwd: list[float] = []
    _wrap_execute(runner, fwd)
    params = SamplingParams(temperature=0.0, max_tokens=args.warmup + args.steps + 1, ignore_eos=True)
    result: dict[str, Any] = {"start_s": round(start_s, 1), "threads": torch.get_num_threads(), "batches": {}}
    for b in args.batches:
        for s in range(b):
            engine.add_request(f"b{b}s{s}", TokensPrompt(prompt_token_ids=_prompt(s, args.context)), params)
        # Prefill steps until every sequence has its first token (one decode row each after).
        while runner.input_batch.num_reqs < b or any(
            runner.requests[r].num_computed_tokens < args.context for r in runner.requests
        ):
            engine.step()
        step: list[float] = []
        cpu: list[float] = []
        turns.barrier(f"b{b}")
        fwd.clear()
        for i in range(args.warmup + args.steps):
            turns.wait()
            t, c = time.perf_counter(), time.process_time()
            engine.step()
            turns.done()
            if i >= args.warmup:
                step.append(time.perf_counter() - t)
                cpu.append(time.process_time() - c)
        result["batches"][b] = {
            "step_ms": _ms(step),
            "forward_ms": _ms(fwd[args.warmup :]),
            "cpu_ms": _ms(cpu),
        }
        while engine.has_unfinished_requests():
            engine.step()
    if args.prefill:
        one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
        step, cpu = [], []
        turns.barrier("prefill")
        fwd.clear()
        for i in range(args.warmup + args.steps):
            engine.add_request(f"p{i}", TokensPrompt(prompt_token_ids=_prompt(1000 + i, args.prefill)), one)
            turns.wait()
            t, c = time.perf_counter(), time.process_time()
            while engine.has_unfinished_requests():
                engine.step()
            turns.done()
            if i >= args.warmup:
                step.append(time.perf_counter() - t)
                cpu.append(time.process_time() - c)
        result["prefill"] = {"step_ms": _ms(step), "forward_ms": _ms(fwd[args.warmup :]), "cpu_ms": _ms(cpu)}
    return result


def child(args: argparse.Namespace) -> None:
    t0 = time.perf_counter()
    turns = Turns(args.turn_dir, args.turn_side, args.turn_sides)
    result = (run_engine if args.side == "engine" else run_generate)(args, turns)
    result.update(side=args.side, compile=args.compile, wall_s=round(time.perf_counter() - t0, 1))
    print("RESULT " + json.dumps(result), flush=True)


SIDES = {
    "engine-eager": ["--side", "engine", "--compile", "off"],
    "engine-compile": ["--side", "engine", "--compile", "on"],
    "generate-compile": ["--side", "generate", "--compile", "on"],
    "generate-eager": ["--side", "generate", "--compile", "off"],
}


def _run_sides(sides: list[str], rest: list[str], threads: int) -> list[dict[str, Any]]:
    """Run the sides at once, their timed steps in lock-step (:class:`Turns`)."""
    import tempfile

    turn_dir = tempfile.mkdtemp(prefix="fc-turns-")
    (Path(turn_dir) / "turn").write_text("0")
    procs = []
    for k, side in enumerate(sides):
        turn = ["--turn-dir", turn_dir, "--turn-side", str(k), "--turn-sides", str(len(sides))]
        cmd = [sys.executable, "-m", "bench.forward_compile", "--child", *SIDES[side], *turn, *rest]
        out = tempfile.TemporaryFile(mode="w+")
        procs.append((side, subprocess.Popen(cmd, cwd=REPO, env=_child_env(threads), stdout=out, stderr=out), out))
    results = []
    for side, proc, out in procs:
        proc.wait()
        out.seek(0)
        text = out.read()
        line = next((x for x in text.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            for _, other, _ in procs:
                other.kill()
            sys.stderr.write(text[-8000:])
            raise SystemExit(f"{side} failed (rc {proc.returncode})")
        results.append(json.loads(line.removeprefix("RESULT ")))
    return results


def parent(args: argparse.Namespace, rest: list[str]) -> None:
    sides = args.sides.split(",")
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in sides}
    for rep in range(args.repeats):
        load = os.getloadavg()[0]
        order = sides if rep % 2 == 0 else list(reversed(sides))
        for result in _run_sides(order, rest, args.threads):
            result.update(rep=rep, load1_before=round(load, 2), load1_after=round(os.getloadavg()[0], 2))
            print(json.dumps(result), flush=True)
            runs[f"{result['side']}-{'compile' if result['compile'] == 'on' else 'eager'}"].append(result)
    summary: dict[str, Any] = {}
    for side, results in runs.items():
        summary[side] = {
            "start_s": [r["start_s"] for r in results],
            **{
                f"b{b}": {
                    key: round(statistics.median(r["batches"][str(b)][key] for r in results), 2)
                    for key in ("step_ms", "forward_ms", "cpu_ms")
                }
                for b in args.batches
            },
        }
        if args.prefill:
            summary[side]["prefill"] = {
                key: round(statistics.median(r["prefill"][key] for r in results), 2)
                for key in ("step_ms", "forward_ms", "cpu_ms")
            }
    print("SUMMARY " + json.dumps(summary))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--side", choices=["engine", "generate"])
    ap.add_argument("--compile", choices=["on", "off"], default="off")
    ap.add_argument("--sides", default="engine-eager,engine-compile,generate-compile")
    ap.add_argument("--turn-dir")
    ap.add_argument("--turn-side", type=int, default=0)
    ap.add_argument("--turn-sides", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default=str(REPO / "var" / "models" / "SmolLM2-135M-Instruct"))
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 8])
    ap.add_argument("--prefill", type=int, default=0, help="also time prefills of this many tokens (0: none)")
    args, _ = ap.parse_known_args()
    if args.child:
        child(args)
        return
    rest = [
        a
        for flag in ("--model", "--dtype", "--context", "--steps", "--warmup", "--prefill")
        for a in (flag, str(getattr(args, flag[2:])))
    ]
    rest += ["--batches", ",".join(map(str, args.batches))]
    parent(args, rest)


if __name__ == "__main__":
    main()
