"""The prefix cache from the LIP SDK against a real worker (tiny model): a second session of the
same tenant starting a fresh file with the same prompt gets the same distribution and reports
the reused tokens as ``cached_tokens`` (not prefill); ``kv_create(cache=False)`` neither reuses
nor offers its pages; another tenant reuses nothing."""

from __future__ import annotations

import uuid

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.timeout(300)]


def _first_pred(worker, tenant: str, prompt: list[int], cache: bool = True) -> tuple[list[int], dict]:
    """One session: a fresh file, one ``pred`` of ``prompt``; its most likely token and usage."""
    import symphony as sy

    info = worker.create_session(tenant)
    lip = sy.connect(info.socket_path, info.token)
    try:
        kv = lip.kv_create(cache=cache)
        top = list(lip.pred(kv, prompt)[-1].topk(1).ids)
        assert len(kv) == len(prompt)
    finally:
        lip.close()
    return top, worker.end_session(info.session_id).usage


def test_same_tenant_reuses_whole_pages_and_cache_false_opts_out(gpu_worker_process) -> None:
    worker = gpu_worker_process
    block = worker.admin.health()["block_size"]
    tenant, other = f"pc-{uuid.uuid4().hex[:8]}", f"pc-{uuid.uuid4().hex[:8]}"
    prompt = [(13 * i + 7) % 4000 + 30 for i in range(2 * block + 9)]

    opted_out, usage = _first_pred(worker, tenant, prompt, cache=False)
    assert usage["cached_tokens"] == 0
    first, usage = _first_pred(worker, tenant, prompt, cache=False)
    assert usage["cached_tokens"] == 0 and first == opted_out  # nothing offered by the opted-out file

    first, usage = _first_pred(worker, tenant, prompt)
    assert usage["cached_tokens"] == 0 and usage["prefill_tokens"] == len(prompt)
    again, usage = _first_pred(worker, tenant, prompt)
    assert usage["cached_tokens"] == 2 * block and usage["prefill_tokens"] == len(prompt) - 2 * block
    assert again == first == opted_out
    _, usage = _first_pred(worker, tenant, prompt, cache=False)
    assert usage["cached_tokens"] == 0  # an opted-out file maps nothing either

    _, usage = _first_pred(worker, other, prompt)
    assert usage["cached_tokens"] == 0  # never across tenants
    assert worker.admin.health()["pages_prefix_cached"] > 0
    worker.assert_alive()
