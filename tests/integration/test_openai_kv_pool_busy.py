"""A /v1 request refused because its account holds its bound of the worker's device KV pool is a
429 ``kv_pool_busy``, not a 400 ``context_length_exceeded`` (the issue: a 32-token prompt got
the 400 while another tenant's runs held the pool). Through the whole real stack (uvicorn,
Celery, the built-in program, the worker on the tiny model with a 23-page pool): another tenant
of the same account holds the account's ceiling; a short chat of the account is answered 429 in
OpenAI's error envelope, while another account's chat is answered meanwhile."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gpu_worker.resource_model import Pool, PoolName
from tests.plugins.worker import RunningWorker, start_worker

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.integration,
    pytest.mark.docker,
    pytest.mark.vllm,
    pytest.mark.timeout(300),
]

SHORT = [{"role": "user", "content": "Say hi."}]


@pytest.fixture(scope="module")
def stack_worker(tiny_model_dir: Path) -> Iterator[RunningWorker]:
    with start_worker(tiny_model_dir, name="kv-pool-busy", num_pages=24) as worker:
        yield worker


def _post(stack: str, secret: str, body: dict) -> httpx.Response:
    headers = {"Authorization": f"Bearer {secret}"}
    return httpx.post(f"{stack}/v1/chat/completions", json=body, headers=headers, timeout=180)


def test_a_request_refused_for_device_pages_is_a_429_not_context_length(
    stack, stack_worker, api_tenant_a, api_tenant_b
) -> None:
    import symphony as sy

    health = stack_worker.admin.health()
    pool, block = Pool(PoolName.DEVICE_KV_PAGES, health["pages_total"]), health["block_size"]
    account = api_tenant_a.tenant.account_key
    # Another tenant of the same person holds all the account may hold of the pool.
    with stack_worker.session("alpha-sibling", account=account) as info:
        hog = sy.connect(info.socket_path, info.token)
        try:
            for first, pages in enumerate((10, pool.ceiling - 10)):  # each file within the model's context
                kv = hog.kv_create()
                hog.pred(kv, [first, *((7 * i + 3) % 4000 + 30 for i in range(pages * block - 1))])[-1].release()

            refused = _post(stack, api_tenant_a.key_secret, {"model": "m", "max_tokens": 4, "messages": SHORT})
            assert refused.status_code == 429, refused.text[:500]
            error = refused.json()["error"]
            assert error["code"] == "kv_pool_busy" and error["type"] == "rate_limit_error", error
            assert f"this account holds {pool.ceiling} of the worker's {pool.capacity} device pages" in error["message"]

            other = _post(stack, api_tenant_b.key_secret, {"model": "m", "max_tokens": 4, "messages": SHORT})
            assert other.status_code == 200, other.text[:500]
            assert other.json()["choices"][0]["message"]["role"] == "assistant"
        finally:
            hog.close()
    assert str(uuid.UUID(refused.headers["X-Symphony-Run-Id"]))  # a run was made and refused
