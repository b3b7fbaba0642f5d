"""KVFS over the real engine: a named file spilled to disk (or to host and back, the second time
from its clean copy) and reloaded is byte-identical and answers the next token exactly as a
from-scratch prefill does.

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

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    from gpu_worker.batch import Batch, SeqWork
    from gpu_worker.engine import Engine, EngineConfig
    from gpu_worker.kvfs import KVFS, LocalKVStore, Owner

    model_dir, store_dir = sys.argv[1], sys.argv[2]
    engine = Engine(EngineConfig(model_dir=model_dir, dtype="float32", num_pages=16, max_model_len=512))
    fs = KVFS(engine.num_pages, engine.block_size, engine.page_bytes, engine, LocalKVStore(store_dir), host_pages=8)
    owner = Owner("acme", "s1")

    def run(h, toks):
        plan = fs.plan_append(owner, h, toks)
        n = len(plan.run_token_ids)
        work = SeqWork(plan.seq_id, plan.run_token_ids, plan.num_computed_tokens, plan.page_ids, (n - 1,))
        (logits,) = engine.forward(Batch((work,), plan.page_copies))
        fs.commit_append(plan)
        return logits[0].float().cpu()

    prompt = [(7 * i + 3) % 1000 + 10 for i in range(2 * engine.block_size + 5)]
    h = fs.create(owner, "doc")
    run(h, prompt)
    pages = list(fs._handles.get(owner, h).file.pages)
    before = engine.read_pages(pages)
    fs.close(owner, h)
    fs.evict("acme", "doc")
    residency = [r.residency for r in fs.list_files()]
    # Reuse the freed device pages for something else, so a reload must really restore them.
    other = fs.create(owner)
    run(other, [5] * (3 * engine.block_size))
    fs.close(owner, other)
    r = fs.open(owner, "doc", "w")
    after = engine.read_pages(fs._handles.get(owner, r).file.pages)
    next_from_reload = run(r, [42])
    fresh = fs.create(owner)
    next_from_scratch = run(fresh, prompt + [42])
    fs.close(owner, r)
    fs.close(owner, fresh)

    # Host tier with a clean copy: spill (copy), reload (copy kept), spill again (no copy), reuse
    # the freed pages, reload: the pages must still be the file's.
    doc = fs._named[("acme", "doc")]
    on_device = engine.read_pages(doc.pages)
    fs._spill(doc)
    fs.close(owner, fs.open(owner, "doc", "r"))
    reads = []
    read_pages = engine.read_pages
    engine.read_pages = lambda ids: reads.append(len(ids)) or read_pages(ids)
    fs._spill(doc)
    host_residency = [r.residency for r in fs.list_files()]
    other = fs.create(owner)
    run(other, [9] * (3 * engine.block_size))
    fs.close(owner, other)
    again = fs.open(owner, "doc", "r")
    clean_identical = bool(torch.equal(read_pages(fs._handles.get(owner, again).file.pages), on_device))
    next_after_host = run(again, [42])  # the file holds prompt + [42] since the writer's run
    scratch = fs.create(owner)
    next_after_host_from_scratch = run(scratch, prompt + [42, 42])
    fs.check()
    engine.close()
    print(json.dumps({
        "residency_after_evict": residency,
        "identical": bool(torch.equal(before, after)),
        "max_diff": float((next_from_reload - next_from_scratch).abs().max()),
        "argmax": [int(next_from_reload.argmax()), int(next_from_scratch.argmax())],
        "page_bytes": engine.page_bytes,
        "host_residency": host_residency,
        "pages_read_by_clean_spill": sum(reads),
        "clean_identical": clean_identical,
        "max_diff_after_host": float((next_after_host - next_after_host_from_scratch).abs().max()),
        "blob": (__import__("pathlib").Path(store_dir) / "acme" / "doc.safetensors").stat().st_size,
    }))
    """
)


def test_spill_to_disk_and_reload_through_real_engine(tiny_model_dir: Path, tmp_path: Path) -> None:
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
    assert out["residency_after_evict"] == ["disk"]
    assert out["identical"], "reloaded KV pages differ from the spilled ones"
    assert out["blob"] >= 3 * out["page_bytes"]
    assert out["argmax"][0] == out["argmax"][1]
    assert out["max_diff"] < 1e-3, out
    # A file reloaded from host keeps a clean copy: spilling it again reads no page, and the
    # next reload still restores exactly its KV.
    assert out["host_residency"] == ["host"]
    assert out["pages_read_by_clean_spill"] == 0
    assert out["clean_identical"], "a clean-copy reload restored different KV"
    assert out["max_diff_after_host"] < 1e-3, out
