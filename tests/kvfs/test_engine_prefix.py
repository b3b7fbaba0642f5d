"""The prefix cache over the real engine: a second KV file with the same prompt (and a longer
one, as a conversation's next turn) maps the cached whole pages, computes only the tail, and
gets the next-token distribution of a from-scratch prefill to float32 rounding.

Runs in a subprocess (one vLLM engine per process) on the tiny random Llama for speed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
#: Largest logit difference float32 rounding explains here (logits of the tiny model are O(1)).
ROUNDING = 1e-5

SCRIPT = textwrap.dedent(
    """
    import json, sys
    from gpu_worker.batch import Batch, SeqWork
    from gpu_worker.engine import Engine, EngineConfig
    from gpu_worker.kvfs import KVFS, LocalKVStore, Owner

    model_dir, store_dir = sys.argv[1], sys.argv[2]
    engine = Engine(EngineConfig(model_dir=model_dir, dtype="float32", num_pages=32, max_model_len=1024))
    fs = KVFS(engine.num_pages, engine.block_size, engine.page_bytes, engine, LocalKVStore(store_dir),
              prefix_cache=True)
    bs = engine.block_size
    computed = []

    def first_pred(owner, toks, cache=True):
        h = fs.create(owner, cache=cache)
        mapped = fs.map_cached_prefix(owner, h, toks, len(toks) - 1)
        plan = fs.plan_append(owner, h, toks[mapped:])
        n = len(plan.run_token_ids)
        computed.append(n)
        work = SeqWork(plan.seq_id, plan.run_token_ids, plan.num_computed_tokens, plan.page_ids, (n - 1,))
        (logits,) = engine.forward(Batch((work,), plan.page_copies))
        fs.commit_append(plan)
        return h, mapped, logits[0].float().cpu()

    a, b, c = Owner("acme", "s1"), Owner("acme", "s2"), Owner("acme", "s3")
    prompt = [(7 * i + 3) % 1000 + 10 for i in range(3 * bs + 5)]
    ha, mapped_a, first = first_pred(a, prompt)
    fs.close(a, ha)  # the first turn's file is gone: its full pages stay cached
    hb, mapped_b, cached = first_pred(b, prompt)
    _, _, scratch = first_pred(c, prompt, cache=False)
    turn2 = prompt + [(11 * i + 5) % 1000 + 10 for i in range(bs + 3)]
    _, mapped_t2, cached_t2 = first_pred(b, turn2)
    _, _, scratch_t2 = first_pred(c, turn2, cache=False)
    fs.check()
    engine.close()
    print(json.dumps({
        "bs": bs, "prompt": len(prompt), "turn2": len(turn2),
        "mapped": [mapped_a, mapped_b, mapped_t2], "computed": computed,
        "max_diff": float((cached - scratch).abs().max()),
        "max_diff_first": float((first - scratch).abs().max()),
        "max_diff_turn2": float((cached_t2 - scratch_t2).abs().max()),
        "argmax": [int(cached.argmax()), int(scratch.argmax()), int(cached_t2.argmax()), int(scratch_t2.argmax())],
    }))
    """
)


def test_cached_prefix_gives_the_from_scratch_distribution_and_computes_only_the_tail(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tiny_model_dir), str(tmp_path / "store")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    bs, n, n2 = out["bs"], out["prompt"], out["turn2"]
    full = (n - 1) // bs * bs
    # The second turn's prompt starts with the first's: its cached whole pages map (its 4th page
    # was never full in any cached file).
    assert out["mapped"] == [0, full, full], out
    # Only the tail after the cached whole pages is computed.
    assert out["computed"] == [n, n - full, n, n2 - full, n2], out
    assert out["argmax"][0] == out["argmax"][1] and out["argmax"][2] == out["argmax"][3]
    # The same KV read by the same kernels, in float32: the distributions match to rounding. A
    # tail over cached pages sums attention in another order than a whole prefill, so the last
    # bits may differ (0.0 on one vLLM-CPU host, 4.8e-7 on another); a wrong or shifted page
    # moves logits by orders of magnitude more.
    assert max(out["max_diff"], out["max_diff_turn2"], out["max_diff_first"]) <= ROUNDING, out
