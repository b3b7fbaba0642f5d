"""The live events a real worker publishes for a run's session (Redis stream ``run:<run_id>``)."""

from __future__ import annotations

import json
import uuid

import pytest
import redis

from tests.conftest import redis_db_url, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.vllm]


def test_a_run_shorter_than_the_kv_tick_still_reports_the_kv_it_held(gpu_worker_process):
    """The worker samples KV usage twice a second; a run that ends sooner got no ``kv`` event
    and the console's KV panel stayed empty for it. Ending the session reports the last state."""
    import symphony

    run_id = f"r-{uuid.uuid4().hex[:8]}"
    info = gpu_worker_process.create_session(run_id=run_id)
    sdk = symphony.connect(info.socket_path, info.token)
    doc = sdk.kv_create("notes")
    sdk.pred(doc, list(range(100, 140)))[-1].release()
    sdk.close()
    gpu_worker_process.end_session(info.session_id)  # well within the first tick

    events = redis.Redis.from_url(redis_db_url(0))
    stream = f"run:{run_id}"

    def kv_events() -> list[dict]:
        return [json.loads(f[b"data"]) for _, f in events.xrange(stream) if f[b"type"] == b"kv"]

    wait_for(lambda: kv_events(), timeout=10, message="a kv event")
    last = kv_events()[-1]
    assert last["tokens"] == 40 and last["tenant_device_pages"] >= 1, last
    events.delete(stream)
