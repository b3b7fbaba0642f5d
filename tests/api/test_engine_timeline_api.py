"""``GET /staff/workers/<name>/timeline``: a worker's last forwards, read from the real worker
over its admin socket (its ring: gpu_worker/engine_timeline.py). Staff only; a worker with no
live heartbeat is a 404, one that cannot be asked a 503, both in the error envelope."""

from __future__ import annotations

import time
import uuid

import pytest

import symphony as sy
from gpu_worker import contracts, protocol
from tests.conftest import redis_db_url

pytestmark = [pytest.mark.django_db, pytest.mark.integration, pytest.mark.vllm, pytest.mark.timeout(600)]


@pytest.fixture
def served_worker(gpu_worker_process, settings):
    """The real worker as this host's, its heartbeat read where it writes it."""
    settings.REDIS_URL = redis_db_url(0)
    settings.SYMPHONY_WORKER_NAME = gpu_worker_process.name
    settings.SYMPHONY_WORKER_ADMIN_SOCKET = gpu_worker_process.admin_socket
    from api.services import routing

    deadline = time.monotonic() + 20
    while gpu_worker_process.name not in {w.name for w in routing.live_workers()}:
        assert time.monotonic() < deadline, "the worker's heartbeat never showed"
        time.sleep(0.2)
    return gpu_worker_process


def _decode(worker, tenant: str, steps: int) -> int:
    info = worker.admin.create_session(tenant, f"r-{uuid.uuid4().hex[:8]}", {})
    s = sy.connect(info.socket_path, info.token)
    try:
        ids = s.tokenize(f"A staff timeline {uuid.uuid4().hex} of")
        s.pred_tokens(s.kv_create(), ids, steps, stop=[])
    finally:
        s.close()
        worker.admin.end_session(info.session_id)
    return len(ids)


def test_staff_read_a_workers_forwards_as_json_and_for_perfetto(served_worker, admin_client, api_tenant_a) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    prompt = _decode(served_worker, tenant, 4)
    url = f"/api/v1/staff/workers/{served_worker.name}/timeline"

    answer = admin_client.get(url)
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["worker"] == served_worker.name and body["capacity"] == protocol.MAX_TIMELINE_FORWARDS
    forwards = body["forwards"]
    assert 4 <= len(forwards) <= body["recorded"]
    ours = [f for f in forwards if f"tenant:{tenant}" in f["tokens_per_account"]]
    assert sum(f["prompt_tokens"] for f in ours) == prompt and sum(f["decode_tokens"] for f in ours) == 3
    assert {f["batch_size"] for f in ours} == {1} and all(f["duration_s"] > 0 for f in ours)

    chrome = admin_client.get(url, {"format": "chrome"})
    assert chrome.status_code == 200, chrome.content
    events = chrome.json()["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    assert len(slices) == len(forwards) and {e["name"] for e in slices} == {"forward"}
    assert slices[0]["ts"] == 0 and all(e["dur"] > 0 for e in slices)
    assert chrome.json()["otherData"]["worker"] == served_worker.name

    assert admin_client.get(url, {"format": "xml"}).status_code == 400
    # A tenant's member never sees it (it names every account's load).
    refused = api_tenant_a.session_client().get(url)
    assert refused.status_code == 403 and refused.json()["error"]["code"]


def test_an_unknown_worker_is_a_404_and_one_that_cannot_be_asked_a_503(served_worker, admin_client) -> None:
    missing = admin_client.get("/api/v1/staff/workers/no-such-worker/timeline")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"

    import redis

    # A heartbeat with no executor serving its queue: live, but nothing can ask it.
    ghost = f"ghost-{uuid.uuid4().hex[:6]}"
    client = redis.Redis.from_url(redis_db_url(0))
    key = contracts.heartbeat_key(ghost)
    info = {"name": ghost, "ok": True, "pages_free": 1, "pages_total": 1, "sessions": 0}
    client.set(key, contracts.encode_heartbeat(info), ex=contracts.HEARTBEAT_TTL_S)
    try:
        gone = admin_client.get(f"/api/v1/staff/workers/{ghost}/timeline")
    finally:
        client.delete(key)
    assert gone.status_code == 503 and gone.json()["error"]["code"] == "worker_unavailable"
    assert "Traceback" not in gone.content.decode()
