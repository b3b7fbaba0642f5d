"""The built-in OpenAI program's in-process path (api/services/trusted_runs.py) through the
whole real stack (uvicorn, Celery, gVisor, the worker on the tiny model).

What it must keep identical to a tenant program's run is checked against one: the same source
pushed as an ordinary program and run through Celery and the sandbox with the same arguments
gives the same result, the same metered tokens and the same event stream. That the fast path
takes no Celery hop is shown by stopping the stack's Celery worker: OpenAI requests are still
answered; with ``SYMPHONY_TRUSTED_BUILTIN=0`` they wait for Celery (queued) instead.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest
import redis

from tests.conftest import celery_worker, wait_for
from tests.plugins.worker import RunningWorker

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.integration,
    pytest.mark.docker,
    pytest.mark.vllm,
    pytest.mark.timeout(400),
]

CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def stack_worker(shared_stack_worker: RunningWorker) -> RunningWorker:
    return shared_stack_worker


@pytest.fixture
def stack_env(request) -> dict[str, str]:
    """The fast path is on by default; the test named ``..._setting_off_...`` turns it off."""
    return {"SYMPHONY_TRUSTED_BUILTIN": "0"} if "setting_off" in request.node.name else {}


def _stop_celery(stack) -> None:
    stack.celery.terminate()
    stack.celery.wait(timeout=30)


def _chat(stack: str, secret: str, timeout: float = 120, **body) -> httpx.Response:
    body = {"model": "m", "messages": CHAT, "max_tokens": 8, "temperature": 0, **body}
    headers = {"Authorization": f"Bearer {secret}"}
    return httpx.post(f"{stack}/v1/chat/completions", json=body, headers=headers, timeout=timeout)


def _events(run_id: str) -> list[tuple[str, str]]:
    """The run's stream entries, once its ``end`` is in, without the worker's ``kv`` samples
    (taken on a clock tick: how many a run gets depends on its timing, not on its path); the
    final one is checked to be there."""
    entries = _entries(run_id)
    assert "kv" in [t for t, _ in entries], entries
    return [(t, d) for t, d in entries if t != "kv"]


def _event_types(run_id: str) -> list[str]:
    return [t for t, _ in _entries(run_id)]


def _entries(run_id: str) -> list[tuple[str, str]]:
    """The run's stream entries ``(type, data)``, once its ``end`` is in."""
    from django.conf import settings

    from gpu_worker import contracts

    client = redis.Redis.from_url(settings.REDIS_URL)

    def entries() -> list[tuple[str, str]]:
        return [contracts.entry_strings(fields) for _, fields in client.xrange(contracts.run_stream_key(run_id))]

    wait_for(lambda: "end" in [t for t, _ in entries()], 30, 0.1, f"run {run_id}'s end event")
    return entries()


def _wait_finished(run_id: str, timeout: float = 120.0):
    from api.models import Run, UsageRecord

    wait_for(
        lambda: UsageRecord.objects.filter(run_id=run_id).exists(), timeout, 0.2, f"run {run_id} to record its usage"
    )
    return Run.objects.get(pk=run_id)


def test_fast_path_runs_without_celery_and_records_the_same_run_usage_billing_and_events(
    stack, stack_worker, api_tenant_a
):
    from api.models import Program, Run, UsageRecord
    from api.services import billing, programs
    from api.services.openai_requests import BUILTIN_SOURCE
    from api.services.runs import create_run

    _stop_celery(stack)  # nothing may depend on a Celery hop now
    answer = _chat(stack, api_tenant_a.key_secret)
    assert answer.status_code == 200, answer.text[:500]
    body = answer.json()
    run_id = answer.headers["X-Symphony-Run-Id"]
    fast = _wait_finished(run_id)
    assert fast.status == "succeeded" and fast.worker == stack_worker.name and fast.started_at, fast
    assert fast.api_key_id is not None and fast.program_version.program.name == "openai-compat"
    usage = UsageRecord.objects.get(run_id=run_id)
    assert usage.tenant_id == api_tenant_a.tenant.pk and usage.prefill_tokens >= body["usage"]["prompt_tokens"] > 0
    # The first token comes from the prompt's forward; one decode forward per further token.
    assert usage.decode_tokens == body["usage"]["completion_tokens"] - 1 and usage.pred_calls > 0
    assert usage.sandbox_seconds > 0
    month = fast.created_at.strftime("%Y-%m")
    invoice = billing.invoice(api_tenant_a.tenant, month)
    assert invoice["runs"] == 1 and float(invoice["total"]) >= 0, invoice
    billed = {line["item"]: float(line["quantity"]) for line in invoice["lines"]}
    assert billed["prefill_tokens"] == usage.prefill_tokens, invoice
    fast_events = _events(run_id)

    # The same program pushed as a tenant's own and run the ordinary way (Celery + sandbox).
    own = Program.objects.create(tenant=api_tenant_a.tenant, name="my-openai-compat")
    programs.add_version(own, "openai_lip.py", BUILTIN_SOURCE.read_bytes())
    with celery_worker(stack.queue, stack.env):
        sandboxed, _ = create_run(api_tenant_a.tenant, own, None, fast.args, fast.limits)
        slow = _wait_finished(str(sandboxed.pk), timeout=240)
    assert slow.status == "succeeded", (slow.status, slow.error)
    assert slow.result == fast.result, (slow.result, fast.result)
    slow_usage = UsageRecord.objects.get(run_id=slow.pk)
    for field in ("prefill_tokens", "decode_tokens", "pred_calls", "streamed_bytes", "io_calls"):
        assert getattr(slow_usage, field) == getattr(usage, field), field
    # The same events with the same data (deltas, status, end with the result), in the same order.
    assert _events(str(slow.pk)) == fast_events, (_events(str(slow.pk)), fast_events)
    types = [t for t, _ in fast_events]
    assert types[0] == "status" and types[-2:] == ["status", "end"] and "message" in types, types
    assert Run.objects.filter(tenant=api_tenant_a.tenant).count() == 2


def test_client_disconnect_cancels_a_fast_path_run(stack, api_tenant_a):
    from api.models import Run, UsageRecord

    _stop_celery(stack)
    headers = {"Authorization": f"Bearer {api_tenant_a.key_secret}"}
    body = {"model": "m", "messages": CHAT, "max_tokens": 1500, "temperature": 0, "stream": True}
    with httpx.Client(timeout=120) as client:
        with client.stream("POST", f"{stack}/v1/chat/completions", json=body, headers=headers) as response:
            assert response.status_code == 200
            run_id = response.headers["X-Symphony-Run-Id"]
            lines = response.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            assert "chat.completion.chunk" in first, first
        # Leaving the block closes the connection with the answer unfinished.
    wait_for(lambda: Run.objects.get(pk=run_id).status == "cancelled", 60, 0.2, "the run to be cancelled")
    wait_for(lambda: UsageRecord.objects.filter(run_id=run_id).exists(), 60, 0.2, "its usage")
    usage = UsageRecord.objects.get(run_id=run_id)
    assert 0 < usage.decode_tokens < 1500, usage.decode_tokens  # stopped early, billed for what it did
    run = Run.objects.get(pk=run_id)
    assert "cancelled" in run.error, run.error
    assert _event_types(run_id)[-1] == "end"


def test_concurrent_fast_path_requests_each_get_their_own_session(stack, api_tenant_a):
    """Several runs at once in one web process: each stream is its own run's (a shared SDK
    session would mix them), and each run is recorded."""
    import concurrent.futures

    from api.models import Run

    _stop_celery(stack)

    def ask(n: int) -> tuple[str, str]:
        messages = [{"role": "user", "content": f"Count to {n}."}]
        response = _chat(stack, api_tenant_a.key_secret, messages=messages, stream=True, max_tokens=12 + n)
        assert response.status_code == 200, response.text[:500]
        chunks = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]
        streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        return response.headers["X-Symphony-Run-Id"], streamed

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        results = list(pool.map(ask, range(3)))
    assert len({run_id for run_id, _ in results}) == 3
    for run_id, streamed in results:
        run = _wait_finished(run_id)
        assert run.status == "succeeded", run.error
        assert streamed == run.result["choices"][0]["text"], (streamed, run.result)
        assert run.result["usage"]["completion_tokens"] <= 12 + 2
    assert Run.objects.filter(tenant=api_tenant_a.tenant, status="succeeded").count() == 3


def test_with_the_setting_off_the_sandbox_path_is_used(stack, api_tenant_a):
    from api.models import Run

    _stop_celery(stack)
    started = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):
        _chat(stack, api_tenant_a.key_secret, timeout=4)
    assert time.monotonic() - started >= 3.5
    waiting = Run.objects.get(tenant=api_tenant_a.tenant)
    assert waiting.status in ("queued", "cancelled"), waiting.status  # the disconnect cancels it
    # With Celery back, the next request is answered through it (and the sandbox).
    with celery_worker(stack.queue, stack.env):
        answer = _chat(stack, api_tenant_a.key_secret, timeout=240)
    assert answer.status_code == 200, answer.text[:500]
    run = Run.objects.get(pk=answer.headers["X-Symphony-Run-Id"])
    assert run.status == "succeeded" and run.usage.sandbox_seconds > 0
