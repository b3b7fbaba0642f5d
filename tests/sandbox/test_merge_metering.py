"""Tokens a merge or an extract left to recompute are metered: the next ``pred`` on the new file
computes them along with its own, and the session pays for them as prefill (a merge is never
free compute that the forward runs and no call counts). Real worker, tiny model; every file
opts out of the prefix cache so nothing is mapped instead of computed."""

from __future__ import annotations

import uuid

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.timeout(300)]


def test_recomputed_tokens_of_merge_and_extract_are_prefill(gpu_worker_process) -> None:
    import symphony as sy

    worker = gpu_worker_process
    info = worker.create_session(f"merge-{uuid.uuid4().hex[:8]}")
    lip = sy.connect(info.socket_path, info.token)
    first, second = [40 + i for i in range(20)], [400 + i for i in range(10)]
    try:
        a, b = lip.kv_create(cache=False), lip.kv_create(cache=False)
        lip.pred(a, first)
        lip.pred(b, second)
        merged = lip.kv_merge(a, b)
        assert len(merged) == 30
        lip.pred(merged, [7])  # computes b's 10 shifted tokens and the new one
        middle = lip.kv_extract(a, 5, 15)
        lip.pred(middle, [8])  # the 10 extracted tokens sit at new positions: computed again
    finally:
        lip.close()
    usage = worker.end_session(info.session_id).usage
    assert usage["decode_tokens"] == 2
    assert usage["prefill_tokens"] == len(first) + len(second) + len(second) + 10
    worker.assert_alive()
