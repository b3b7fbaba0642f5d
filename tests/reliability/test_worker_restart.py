"""Persistent KV files survive a worker crash: a named file is written through to the KV store
when its last handle closes, so after SIGKILL and a restart on the same store, reopening it and
predicting the next token gives the distribution a fresh prefill gives."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.plugins.worker import start_worker

pytestmark = [pytest.mark.integration, pytest.mark.vllm]

PROMPT = [(17 * i + 5) % 4000 + 30 for i in range(300)]  # more than two 128-token pages


def _session(worker, tenant: str):
    import symphony

    info = worker.create_session(tenant)
    return info, symphony.connect(info.socket_path, info.token)


def test_named_kv_file_reloads_after_crash_with_identical_logits(tiny_model_dir: Path, tmp_path: Path) -> None:
    store = tmp_path / "kvstore"
    with start_worker(tiny_model_dir, name="before-crash", kv_store=store) as first:
        info, sdk = _session(first, "acme")
        doc = sdk.kv_create("doc")
        sdk.pred(doc, PROMPT)[-1].release()
        doc.close()  # write-through happens here, not at shutdown
        sdk.close()
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(timeout=10)
        first._sessions.clear()
    assert (store / "acme" / "doc.safetensors").is_file()

    with start_worker(tiny_model_dir, name="after-crash", kv_store=store) as second:
        listed = {(f["tenant"], f["name"]): f for f in second.admin.kv_list()}
        assert listed[("acme", "doc")]["tokens"] == len(PROMPT)
        info, sdk = _session(second, "acme")
        reopened = sdk.kv_open("doc", "r")
        assert len(reopened) == len(PROMPT)
        from_reload = sdk.pred(reopened, [42])[-1].topk(8)
        fresh = sdk.kv_create()
        from_scratch = sdk.pred(fresh, [*PROMPT, 42])[-1].topk(8)
        assert from_reload.ids == from_scratch.ids
        assert from_reload.logprobs == pytest.approx(from_scratch.logprobs, abs=1e-3)
        other_info, other = _session(second, "bravo")
        with pytest.raises(Exception, match=r"ENOENT|not found|No such"):
            other.kv_open("doc", "r")  # another tenant's name resolves in its own namespace
        sdk.close()
        other.close()
        second.end_session(info.session_id)
        second.end_session(other_info.session_id)


def test_a_lost_workers_run_scoped_files_go_at_restart_once_their_tree_ended(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Run-scoped files (``run/<name>``) of a worker killed mid-tree are in its store; the
    restarted worker removes those whose tree's root has its ``end`` event (or no stream), and
    keeps a tree still running elsewhere and the tenant's own files."""
    import uuid

    import redis

    import symphony
    from gpu_worker import contracts
    from tests.conftest import redis_db_url, wait_for

    ended, running = str(uuid.uuid4()), str(uuid.uuid4())
    store = tmp_path / "kvstore"
    with start_worker(tiny_model_dir, name="before-loss", kv_store=store) as first:
        for tree in (ended, running):
            info = first.create_session("acme", tree=tree)
            sdk = symphony.connect(info.socket_path, info.token)
            ctx = sdk.kv_create("run/ctx")
            sdk.pred(ctx, PROMPT[:20])[-1].release()
            ctx.close()
            if tree == ended:
                doc = sdk.kv_create("doc")
                doc.close()
            sdk.close()
        names = sorted(f["name"] for f in first.admin.kv_list("acme"))
        assert names == sorted(["doc", f"runtree-{ended}--ctx", f"runtree-{running}--ctx"])
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(timeout=10)
        first._sessions.clear()
    assert (store / "acme" / f"runtree-{ended}--ctx.safetensors").is_file()

    client = redis.Redis.from_url(redis_db_url(0))
    client.xadd(contracts.run_stream_key(ended), contracts.entry(contracts.EndEvent("cancelled")))
    client.xadd(contracts.run_stream_key(running), contracts.entry(contracts.StatusEvent("running")))
    try:
        with start_worker(tiny_model_dir, name="after-loss", kv_store=store) as second:
            left = lambda: sorted(f["name"] for f in second.admin.kv_list("acme"))  # noqa: E731
            wait_for(lambda: f"runtree-{ended}--ctx" not in left(), timeout=60, message="the ended tree's file")
            assert left() == ["doc", f"runtree-{running}--ctx"]
            assert not (store / "acme" / f"runtree-{ended}--ctx.safetensors").exists()
    finally:
        client.delete(contracts.run_stream_key(ended), contracts.run_stream_key(running))
