"""A ``/v1`` request queued behind its tenant's concurrent-run limit waits without polling
PostgreSQL (the isolation issue's "queued /v1 requests retry every 0.25 s against PostgreSQL and
fill the web's 16-connection database pool": another tenant's ``/quota`` went 0.03 -> 0.34 s).

The real view functions on the real PostgreSQL and Redis: the tenant's one run slot is taken,
a chat request waits, and every SQL statement sent meanwhile is counted through Django's
``execute_wrapper`` hook on each connection the request's calls open. It tries once, subscribes
to its tenant's ended-run notices and tries once more (a run that ended in between is not
missed: api/services/run_notices.py), then sends nothing until the run that held the slot ends
(``cancel_run`` publishes the end), and then starts its run at once, not at its queueing
deadline.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db.backends.signals import connection_created
from django.test import RequestFactory

from api.asyncdb import db_call
from api.models import Plan, Program, Run
from api.serializers.openai import ChatCompletionSerializer
from api.services import programs
from api.services.runs import cancel_run
from api.views import openai as openai_views

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration, pytest.mark.timeout(60)]

QUEUE_S = 8.0
WAIT_S = 1.5


def _tries(statements: list[tuple[float, str]], before: float) -> int:
    """Start attempts before ``before``: each locks the tenant's row (api/services/runs.py)."""
    return sum(1 for at, sql in statements if at < before and 'FROM "api_tenant"' in sql and "FOR UPDATE" in sql)


def test_a_queued_v1_request_sends_no_statements_until_a_run_ends(api_tenant_a, settings):
    tenant = api_tenant_a.tenant
    # update_or_create: a transactional test before this one may have flushed the shipped plans.
    Plan.objects.update_or_create(name=tenant.plan, defaults={"max_concurrent_runs": 1})
    settings.SYMPHONY_OPENAI_QUEUE_S = QUEUE_S
    program = Program.objects.create(tenant=tenant, name="holder")
    version = programs.add_version(program, "p.py", b"def main(a):\n    return 1\n")
    holder = Run.objects.create(tenant=tenant, program_version=version, args={}, limits={}, status="running")

    statements: list[tuple[float, str]] = []

    def count(execute: Callable, sql: str, params: Any, many: bool, context: Any) -> Any:
        statements.append((time.monotonic(), sql))
        return execute(sql, params, many, context)

    def instrument(sender: Any, connection: Any, **kwargs: Any) -> None:
        # A thread's connection object is opened again after each call closed it: counted once.
        if count not in connection.execute_wrappers:
            connection.execute_wrappers.append(count)

    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    request = RequestFactory().post(
        "/v1/chat/completions",
        json.dumps(body),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {api_tenant_a.key_secret}",
    )
    key, parsed, plan = openai_views._admit(request, ChatCompletionSerializer)

    async def scenario() -> tuple[float, float, Run]:
        waiting = asyncio.create_task(openai_views._start(key, parsed, plan))
        await asyncio.sleep(WAIT_S)
        assert not waiting.done()
        ended_at = time.monotonic()
        await db_call(cancel_run, holder)
        run = await asyncio.wait_for(waiting, QUEUE_S)
        return ended_at, time.monotonic(), run

    connection_created.connect(instrument)
    try:
        started = time.monotonic()
        ended_at, started_at, run = asyncio.run(scenario())
    finally:
        connection_created.disconnect(instrument)
    tries_while_waiting = _tries(statements, ended_at)
    during_wait = [sql for at, sql in statements if started + 0.5 < at < ended_at]
    print(f"queued /v1: {tries_while_waiting} tries and {len(during_wait)} statements in {WAIT_S} s of waiting")
    assert tries_while_waiting == 2, [sql for _, sql in statements]
    assert during_wait == [], during_wait
    assert run.status == "queued" and run.tenant_id == tenant.pk
    assert started_at - ended_at < 2.0, "the waiter started its run at its deadline, not when the slot freed"
