"""A LIP cannot fill Redis through ``send_to_user`` (the hardening issue's "40 x 1 MB messages
in 1.6 s added 240 MB to Redis, not billed").

A real LIP in gVisor against the real worker and Redis sends big non-ASCII messages: one over
the per-message cap gets ``InvalidArgument`` naming it, and past the run's stream budget
(the plan's ``stream_bytes_per_run``) ``QuotaExceeded`` naming the limit, with nothing more stored. The
stream holds what was sent as UTF-8 (not six-byte ``\\uXXXX`` escapes), and the session's usage
reports the bytes for billing. Another tenant's run streams and succeeds after it. Through the
whole stack (API, Celery, sandbox, worker) the budget is the plan's ``stream_bytes_per_run``
and the streamed bytes land on the tenant's invoice.

Bounded: at most 40 messages of ~200 KB a run, two runs of the flood.
"""

from __future__ import annotations

import time
import uuid

import pytest
import redis

from tests.conftest import redis_db_url, wait_for
from tests.plugins.worker import RunningWorker

pytestmark = [pytest.mark.integration, pytest.mark.docker, pytest.mark.vllm, pytest.mark.timeout(300)]

BUDGET = 1024 * 1024
#: Characters of each message: two UTF-8 bytes each, so ~200 KB a message (1.2 MB escaped).
CHARS = 100_000

FLOOD = """
from symphony import InvalidArgument, QuotaExceeded, send_to_user


def main(args):
    out = {"sent": 0}
    try:
        send_to_user("\u00e9" * 600_000)  # 1.2 MB as UTF-8: over the per-message cap
    except InvalidArgument as exc:
        out["too_big"] = str(exc)
    try:
        for _ in range(40):
            send_to_user("\u00e9" * args["chars"])
            out["sent"] += 1
    except QuotaExceeded as exc:
        out["over_budget"] = str(exc)
    return out
"""

CANARY = """
from symphony import send_to_user


def main(args):
    send_to_user("still here")
    return "ok"
"""


def _message_bytes(chars: int) -> int:
    """Bytes one ``send_to_user("é" * chars)`` takes in the stream (type + JSON data, UTF-8)."""
    return len("token") + len(f'{{"text": "{"é" * chars}"}}'.encode())


def test_send_to_user_is_bounded_per_message_and_per_run_and_metered(lip_runner, empty_stream_pool):
    run_id = f"flood-{uuid.uuid4().hex[:8]}"
    events = redis.Redis.from_url(redis_db_url(0))
    try:
        run = lip_runner.run(FLOOD, {"chars": CHARS}, run_id=run_id, session_limits={"max_stream_bytes": BUDGET})
        res = run.result
        assert res.status == "succeeded", (res.error, res.stderr[-2000:])
        message_bytes = _message_bytes(CHARS)
        fits = BUDGET // message_bytes
        assert res.result["sent"] == fits, res.result
        assert "1048576" in res.result["too_big"], res.result["too_big"]
        assert "stream_bytes_per_run" in res.result["over_budget"] and str(BUDGET) in res.result["over_budget"]

        # Billed: the session's usage counts what was streamed.
        assert run.session_end.usage["streamed_bytes"] == fits * message_bytes

        # Stored: exactly the messages that fitted, as UTF-8.
        time.sleep(0.5)  # the worker publishes on a background thread
        tokens = [f for _, f in events.xrange(f"run:{run_id}") if f[b"type"] == b"token"]
        assert len(tokens) == fits
        assert sum(len(f[b"type"]) + len(f[b"data"]) for f in tokens) == fits * message_bytes
    finally:
        events.delete(f"run:{run_id}")

    started = time.monotonic()
    canary = lip_runner.run(CANARY, tenant=f"canary-{uuid.uuid4().hex[:6]}").result
    assert canary.status == "succeeded" and canary.result == "ok", canary.error
    assert time.monotonic() - started < 60


@pytest.fixture(scope="module")
def stack_worker(shared_stack_worker: RunningWorker) -> RunningWorker:
    return shared_stack_worker


@pytest.mark.django_db(transaction=True)
def test_the_plans_stream_budget_reaches_the_worker_and_streamed_bytes_are_billed(
    stack, api_tenant_a, api_tenant_b, tmp_path, empty_stream_pool
):
    from api.models import Plan, Run, UsageRecord
    from symphony_client import Client

    # update_or_create: a transactional test before this one flushed the plans the migrations made.
    Plan.objects.update_or_create(
        name=api_tenant_a.tenant.plan, defaults={"stream_bytes_per_run": BUDGET, "streamed_gib_price": "1.00"}
    )
    lip = tmp_path / "flood.py"
    lip.write_text(FLOOD)
    client = Client(stack, api_tenant_a.key_secret, timeout=60)
    program = client.upload_program(lip, name="flood")
    run_id = client.create_run(program["id"], args={"chars": CHARS}, limits={"deadline_s": 60})["id"]
    wait_for(lambda: Run.objects.get(pk=run_id).status in Run.TERMINAL, 120, message="the flood run to end")
    run = Run.objects.get(pk=run_id)
    assert run.status == "succeeded", run.error
    fits = BUDGET // _message_bytes(CHARS)
    assert run.result["sent"] == fits and str(BUDGET) in run.result["over_budget"], run.result
    assert UsageRecord.objects.get(run_id=run_id).streamed_bytes == fits * _message_bytes(CHARS)
    from django.utils import timezone

    from api.services.billing import invoice

    lines = {line["item"]: line for line in invoice(api_tenant_a.tenant, timezone.now().strftime("%Y-%m"))["lines"]}
    assert int(lines["streamed_bytes"]["quantity"]) == fits * _message_bytes(CHARS)

    canary = tmp_path / "canary.py"
    canary.write_text(CANARY)
    other = Client(stack, api_tenant_b.key_secret, timeout=60)
    started = time.monotonic()
    canary_id = other.create_run(other.upload_program(canary, name="canary")["id"], args={})["id"]
    wait_for(lambda: Run.objects.get(pk=canary_id).status in Run.TERMINAL, 60, message="the canary run to end")
    assert Run.objects.get(pk=canary_id).status == "succeeded"
    assert time.monotonic() - started < 60
