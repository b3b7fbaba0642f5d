"""B2 — plain greedy completion: an autoregressive LIP vs vLLM, tokens/s.

The LIP, per prompt: ``kv_create``, one fused ``pred(prompt, then=argmax)``, then one fused
``pred([tok])`` per further token, ``kv_close``: the same number of forwards as vLLM (prefill +
out-1 decodes). ``max_batch`` of them run at once. Four Symphony figures:

- **through the gVisor sandbox** (the spec's figure): the LIP is a program run in ``runsc``
  containers, each running several LIP threads on its own session, prompts split evenly; once
  **cold** (``SandboxLauncher.run``: container start included in the time) and once **warm**
  (``SandboxPool.run`` on containers pre-started off the clock, as ``make up`` serves runs);
- **warm, lanes in lock-step**: the same program written with one thread per container that
  steps all its lanes at once with ``pred_token_many`` (one write per step);
- **socket only**: the same loop as threads in this process, one session each (isolates the
  socket + worker path from container start-up).

Baseline: ``LLM.generate`` of all prompts, greedy, ``ignore_eos``, max batch ``max_batch``, the
same number of KV blocks as the worker's pages.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

from bench.baseline_vllm import VLLMBaseline
from bench.harness import (
    BenchResult,
    Comparison,
    EngineTime,
    WorkerOptions,
    WorkerProcess,
    max_len_for,
    random_tokens,
    run_standalone,
    run_threads,
    share_out,
    stopwatch,
    workload_args,
)

NAME = "b2_completion"
TENANT = "bench-b2"
SANDBOX_LIP = """
import threading

from symphony import kv_close, kv_create, pred_token


def main(args):
    counts = []

    def lip(prompts):
        n = 0
        for prompt in prompts:
            kv = kv_create()
            tok = pred_token(kv, prompt)
            n += 1
            for _ in range(args["out_tokens"] - 1):
                tok = pred_token(kv, [tok])
                n += 1
            kv_close(kv)
        counts.append(n)

    threads = [threading.Thread(target=lip, args=(shard,)) for shard in args["shards"]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts)
"""

#: The same completions written with one thread that steps its lanes together: each step's calls
#: go out in one write (``pred_token_many``). Same forwards, far fewer system calls and thread
#: wake-ups in gVisor per step (see NOTES.md, B2).
SANDBOX_LIP_LOCKSTEP = """
from symphony import kv_close, kv_create, pred_token_many


def main(args):
    n = 0
    lanes = args["shards"]
    for k in range(max(len(lane) for lane in lanes)):
        prompts = [lane[k] for lane in lanes if k < len(lane)]
        kvs = [kv_create() for _ in prompts]
        toks = pred_token_many(list(zip(kvs, prompts)))
        n += len(toks)
        for _ in range(args["out_tokens"] - 1):
            toks = pred_token_many([(kv, [tok]) for kv, tok in zip(kvs, toks)])
            n += len(toks)
        for kv in kvs:
            kv_close(kv)
    return n
"""


@dataclass(frozen=True)
class Workload:
    prompts: int = 64
    prompt_tokens: int = 256
    out_tokens: int = 128
    max_batch: int = 64
    #: gVisor containers the sandboxed side splits its lanes over, each one LIP with its share
    #: of the lanes as threads. Each sandbox costs CPU of its own while its threads wait on the
    #: session socket (0.3-4% of a core per waiting thread with Debian's ptrace runsc, by VM; see NOTES.md), so
    #: fewer, wider LIPs are cheaper: ``--sandbox-containers 1`` runs all lanes in one program.
    sandbox_containers: int = 4

    def pages(self, block_size: int) -> int:
        per_seq = -(-(self.prompt_tokens + self.out_tokens) // block_size)
        return 1 + min(self.prompts, self.max_batch) * per_seq


QUICK = Workload(prompts=4, prompt_tokens=64, out_tokens=8, max_batch=4)


def symphony_side(
    worker: WorkerProcess, wl: Workload, prompts: list[list[int]], engine: EngineTime | None = None
) -> float:
    """Output tokens/s of the greedy LIP over the socket (``engine``: adds the engine's time)."""
    sessions = [worker.connect(TENANT) for _ in range(min(wl.max_batch, wl.prompts))]

    def complete(k: int, prompt: list[int]) -> int:
        sess = sessions[k][0]
        kv = sess.kv_create()
        tok = sess.pred_token(kv, prompt)
        for _ in range(wl.out_tokens - 1):
            tok = sess.pred_token(kv, [tok])
        sess.kv_close(kv)
        return wl.out_tokens

    try:
        with stopwatch() as t, engine.measure() if engine else contextlib.nullcontext():
            produced = sum(share_out(prompts, len(sessions), complete))
    finally:
        for sess, sid in sessions:
            worker.end(sess, sid)
    return produced / t[0]


def sandbox_side(worker: WorkerProcess, wl: Workload, prompts: list[list[int]], program: str, runner: Any) -> float:
    """Output tokens/s of the same LIP run in gVisor containers by ``runner`` (launcher or pool)."""
    import uuid

    from sandbox.spec import SandboxSpec

    lanes = min(wl.max_batch, len(prompts))
    containers = min(wl.sandbox_containers, lanes)
    shards = [prompts[i::lanes] for i in range(lanes)]

    def container(c: int) -> int:
        info = worker.admin.create_session(TENANT, f"b2-{uuid.uuid4().hex[:8]}", {})
        try:
            args = {"shards": shards[c::containers], "out_tokens": wl.out_tokens}
            spec = SandboxSpec(program, args, info.socket_path, info.token, info.session_id, TENANT, deadline_s=3600)
            res = runner(spec)
        finally:
            worker.admin.end_session(info.session_id)
        if res is None or res.status != "succeeded":
            detail = "no warm container" if res is None else f"{res.status}: {res.error}\n{res.stderr[-2000:]}"
            raise RuntimeError(f"sandboxed LIP failed ({detail})")
        return int(res.result)

    with stopwatch() as t:
        produced = sum(run_threads([lambda c=c: container(c) for c in range(containers)]))
    return produced / t[0]


def compare_sandboxed(
    worker: WorkerProcess, base: VLLMBaseline, wl: Workload, reps: int, seed: int, workdir: str
) -> list[Comparison]:
    """Cold and warm sandboxed runs against the same baseline repetitions (rotated order)."""
    from sandbox.cold import SandboxLauncher
    from sandbox.image import ensure
    from sandbox.pool import SandboxPool
    from sandbox.spec import SandboxLimits

    image = ensure(log=lambda m: print(m, file=sys.stderr))
    launcher = SandboxLauncher(image=image)
    program, lockstep = f"{workdir}/b2_lip.py", f"{workdir}/b2_lip_lockstep.py"
    for path, text in ((program, SANDBOX_LIP), (lockstep, SANDBOX_LIP_LOCKSTEP)):
        with open(path, "w") as fh:
            fh.write(text)
    containers = min(wl.sandbox_containers, wl.max_batch, wl.prompts)
    cold = Comparison("greedy completion (gVisor sandbox, cold)", "tok/s")
    warm = Comparison("greedy completion (gVisor sandbox, warm pool)", "tok/s")
    warm_lockstep = Comparison("greedy completion (gVisor sandbox, warm pool, lanes in lock-step)", "tok/s")
    for cmp in (cold, warm, warm_lockstep):
        cmp.extra.update(target=">= 0.97x vLLM tokens/s", containers=containers)
    # The pool hard-links session sockets into its slots: same filesystem as the sessions dir.
    with SandboxPool(launcher, size=containers, template=SandboxLimits(image=image), root=worker.base) as pool:

        def warm_run(p: list[list[int]], lip: str) -> float:
            if not pool.wait_ready(pool.size, timeout=120):  # refilled off the clock
                raise RuntimeError("sandbox pool did not fill")
            return sandbox_side(worker, wl, p, lip, pool.run)

        def baseline(p: list[list[int]]) -> float:
            tok_s = base.generate(p, wl.out_tokens).tokens_per_s
            for cmp in (cold, warm, warm_lockstep):
                cmp.baseline.add(tok_s)
            return tok_s

        for i in range(reps):
            prompts = [random_tokens(wl.prompt_tokens, seed, 5, i, p) for p in range(wl.prompts)]
            sides = [
                lambda p=prompts: cold.symphony.add(sandbox_side(worker, wl, p, program, launcher.run)),
                lambda p=prompts: warm.symphony.add(warm_run(p, program)),
                lambda p=prompts: warm_lockstep.symphony.add(warm_run(p, lockstep)),
                lambda p=prompts: baseline(p),
            ]
            for fn in sides[i % 4 :] + sides[: i % 4]:
                fn()
    return [cold, warm, warm_lockstep]


def compare(worker: WorkerProcess, base: VLLMBaseline, wl: Workload, reps: int, seed: int) -> Comparison:
    """Interleaved reps of both sides on the same prompts (reusable with another bench's setup)."""
    # Distinct prompts per rep so neither side serves a rep from the previous rep's cache.
    cmp = Comparison("greedy completion (socket only)", "tok/s")
    cmp.extra["target"] = ">= 0.97x vLLM tokens/s"
    engine = EngineTime(worker)
    for i in range(reps):
        prompts = [random_tokens(wl.prompt_tokens, seed, 4, i, p) for p in range(wl.prompts)]
        sides = [
            (lambda p=prompts: symphony_side(worker, wl, p, engine), cmp.symphony),
            (lambda p=prompts: base.generate(p, wl.out_tokens).tokens_per_s, cmp.baseline),
        ]
        for fn, sample in sides if i % 2 == 0 else reversed(sides):
            sample.add(fn())
    cmp.extra["engine"] = engine.to_dict()
    print("    socket only: " + engine.line(), flush=True)
    return cmp


def main(argv: list[str] | None = None) -> int:
    cfg, wl = workload_args(argv, __doc__ or NAME, Workload(), QUICK)
    max_len = max_len_for(wl.prompt_tokens + wl.out_tokens)
    # vLLM refuses to start unless one sequence of max_len fits (it needs one block beyond it).
    num_pages = max(wl.pages(128), max_len // 128 + 2)
    opts = WorkerOptions(
        model=cfg.model, num_pages=num_pages, dtype=cfg.dtype, max_model_len=max_len, max_num_seqs=wl.max_batch
    )

    def measure(worker: WorkerProcess, base: VLLMBaseline, result: BenchResult) -> None:
        with tempfile.TemporaryDirectory(prefix="b2-") as workdir:
            result.comparisons += compare_sandboxed(worker, base, wl, cfg.reps, cfg.seed, workdir)
        result.comparisons.append(compare(worker, base, wl, cfg.reps, cfg.seed))

    run_standalone(NAME, cfg, wl, opts, measure)
    return 0


if __name__ == "__main__":
    sys.exit(main())
