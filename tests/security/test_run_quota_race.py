"""The concurrent-runs limit holds when a tenant fires many run creations at once: the plan check
and the insert are one step under the tenant's row lock (api/services/runs.py ``create_run``), on
the real PostgreSQL, through the service and through a real uvicorn on both routes that create
runs (``POST /api/v1/runs`` and ``POST /v1/chat/completions``). Another tenant's run is accepted
right after the burst."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from api.models import Program, Run
from api.services import openai_requests, programs
from api.services.quotas import PlanQuotaExceeded, plan_limits
from api.services.runs import create_run
from tests.conftest import at_once

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration, pytest.mark.timeout(120)]

BURST = 24


def _program(tenant) -> Program:
    prog = Program.objects.create(tenant=tenant, name="p")
    programs.add_version(prog, "p.py", b"def main(args):\n    return args\n")
    return prog


def test_simultaneous_creations_never_exceed_the_concurrent_runs_limit(api_tenant_a, api_tenant_b):
    tenant = api_tenant_a.tenant
    prog = _program(tenant)
    limit = plan_limits(tenant).max_concurrent_runs

    def create() -> str:
        try:
            create_run(tenant, prog, None, {}, {})
            return "created"
        except PlanQuotaExceeded:
            return "refused"

    outcomes = at_once([create] * BURST)

    assert outcomes.count("created") == limit, outcomes
    assert outcomes.count("refused") == BURST - limit
    assert Run.objects.filter(tenant=tenant, status__in=["queued", "running"]).count() == limit
    started = time.monotonic()
    canary, created = create_run(api_tenant_b.tenant, _program(api_tenant_b.tenant), None, {}, {})
    assert created and canary.status == "queued" and time.monotonic() - started < 5


def test_one_idempotency_key_sent_at_once_makes_one_run(api_tenant_a):
    tenant = api_tenant_a.tenant
    prog = _program(tenant)

    runs = at_once([lambda: create_run(tenant, prog, None, {}, {}, idempotency_key="same")] * 8)

    assert len({run.pk for run, _ in runs}) == 1
    assert sum(created for _, created in runs) == 1
    assert Run.objects.filter(tenant=tenant).count() == 1


def test_a_burst_over_http_on_both_routes_starts_at_most_the_plans_runs(api_asgi_server, api_tenant_a, api_tenant_b):
    tenant = api_tenant_a.tenant
    prog = _program(tenant)
    openai_requests.builtin_program(tenant)  # as after the tenant's first /v1 request
    limit = plan_limits(tenant).max_concurrent_runs
    auth = {"Authorization": f"Bearer {api_tenant_a.key_secret}"}
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}

    # Released together; every answer is in before a stream closes (closing one cancels its
    # run and frees a slot, which a later request could then rightly take).
    start, decided = threading.Barrier(BURST), threading.Barrier(BURST)

    with httpx.Client(base_url=api_asgi_server, headers=auth, timeout=30) as client:

        def rest() -> tuple[str, int, str]:
            start.wait(timeout=10)
            response = client.post("/api/v1/runs", json={"program": prog.pk})
            decided.wait(timeout=30)
            return "rest", response.status_code, response.json()["error"]["code"] if response.status_code >= 400 else ""

        def openai() -> tuple[str, int, str]:
            # Streaming: the status and headers come once the run exists; the body would wait
            # for a worker, so only the head is read.
            start.wait(timeout=10)
            with client.stream("POST", "/v1/chat/completions", json=chat) as response:
                code = response.read() and response.json()["error"]["code"] if response.status_code >= 400 else ""
                decided.wait(timeout=30)
                return "openai", response.status_code, code

        calls = [rest, openai] * (BURST // 2)
        created_before = Run.objects.filter(tenant=tenant).count()
        with ThreadPoolExecutor(BURST) as pool:
            outcomes = list(pool.map(lambda call: call(), calls))

    accepted = [o for o in outcomes if o[1] in (200, 201)]
    refused = [o for o in outcomes if o[1] == 429]
    assert len(accepted) == limit, outcomes
    assert len(refused) == BURST - limit, outcomes
    # The REST API refuses at once: past the plan's runs (``quota_exceeded``), or, for a burst
    # past the account's share of the web process's database connections (the key lookups of
    # both routes take places in it), before anything is looked at (``throttled``, Retry-After);
    # either way nothing is created. An OpenAI request first waits its bounded time for a slot
    # (none frees up here), then is told to retry (OpenAI's rate-limit code, with Retry-After).
    assert {code for route, _, code in refused if route == "rest"} <= {"quota_exceeded", "throttled"}
    assert {code for route, _, code in refused if route == "openai"} <= {"rate_limit_exceeded"}
    assert Run.objects.filter(tenant=tenant).count() - created_before == limit

    other = api_tenant_b
    started = time.monotonic()
    canary = httpx.post(
        f"{api_asgi_server}/api/v1/runs",
        json={"program": _program(other.tenant).pk},
        headers={"Authorization": f"Bearer {other.key_secret}"},
        timeout=10,
    )
    assert canary.status_code == 201, canary.text
    assert time.monotonic() - started < 10
