"""What a newcomer still tripped on in the console, in real Chromium against the real server
(scenario ``secondPass`` of tests/browser/console.mjs): an ended session mid-form, a failed
run's summary, a cancel asked for in the console, the run's own KV figures, the login form,
focus after moving, and every page at 390 px."""

from __future__ import annotations

import re
import threading
from decimal import Decimal
from pathlib import Path

import pytest

from tests.browser.test_console import _seed_tenant
from tests.browser.test_console_first_minutes import _wait_for

pytestmark = pytest.mark.browser

FAILURE = (
    "ValueError: deliberate failure in step 3\n"
    "Traceback (most recent call last):\n"
    '  File "/lip/story.py", line 9, in main\n'
    '    raise ValueError("deliberate failure in step 3")'
)
# What the executor records for a program stopped by a cancel: its connection broke off.
STOPPED = (
    "ConnectionLost: ECONNLOST the worker connection closed\n"
    "Traceback (most recent call last):\n"
    '  File "/lip/story.py", line 12, in main\n'
    "    sy.sleep(delay)"
)
DOC_LIP = '''"""Greets someone by name,
twice over.

Example args: {"who": "world", "times": 1}
"""


def main(args):
    return ("hello " + args["who"]) * int(args["times"])
'''
KV = {"run_pages": 3, "tenant_device_pages": 11, "tenant_host_pages": 2}


@pytest.fixture(autouse=True)
def _fresh_throttle_counters():
    """Sign-in shares the per-address ``auth`` throttle (see test_console.py)."""
    from django.core.cache import cache

    cache.clear()


def _stream_until_cancelled(run_id: str, ready: Path, cancelled: Path, stdout: str, stop: threading.Event) -> None:
    """Tokens and KV samples as the worker publishes them until the console cancels the run,
    then the executor's late outcome: the stopped program's error, exit code and stdout."""
    import time

    from api.services.runs import RunOutcome, finish_run, publish_event
    from gpu_worker.contracts import KvEvent, TokenEvent

    if not _wait_for(ready, stop):
        return
    i = 0
    while not cancelled.exists() and not stop.is_set() and i < 600:
        publish_event(run_id, TokenEvent(f" w{i}"))
        publish_event(run_id, KvEvent(tokens=5 + i, **KV))
        i += 1
        time.sleep(0.15)
    if not stop.is_set():
        finish_run(
            run_id, RunOutcome(status="failed", result=None, error=STOPPED, exit_code=-15, usage={}, stdout=stdout)
        )


def test_the_console_second_pass(console_server, browser, tmp_path):
    from datetime import timedelta

    from django.utils import timezone

    from api.models import Plan, Program, Run, UsageRecord

    email, password, waiting = _seed_tenant()
    tenant, version = waiting.tenant, waiting.program_version
    # Two runs of its own stay queued (no executor here) beside the seeded running ones.
    Plan.objects.update_or_create(name=tenant.plan, defaults={"max_concurrent_runs": 10})
    now = timezone.now()
    failed = Run.objects.create(
        tenant=tenant, program_version=version, status="failed", error=FAILURE, exit_code=1, started_at=now
    )
    Run.objects.filter(pk=failed.pk).update(
        created_at=now - timedelta(seconds=1),
        finished_at=now + timedelta(seconds=3),
        first_output_at=now + timedelta(seconds=1.4),
    )
    UsageRecord.objects.create(tenant=tenant, run=failed, prefill_tokens=12, decode_tokens=1, streamed_events=1)
    live = Run.objects.create(tenant=tenant, program_version=version, status="running", worker="local", started_at=now)
    ready, cancelled = tmp_path / "ready", tmp_path / "cancelled"
    stdout = "printed before the cancel"
    stop = threading.Event()
    thread = threading.Thread(
        target=_stream_until_cancelled, args=(str(live.pk), ready, cancelled, stdout, stop), daemon=True
    )
    thread.start()
    program = Program.objects.get(tenant=tenant, name="story")
    pages = [
        "/programs",
        f"/programs/{program.pk}",
        "/runs",
        f"/runs/{failed.pk}",
        f"/runs/{live.pk}",
        "/kv-files",
        "/usage",
        "/api-keys",
        "/team",
        "/account",
        "/staff",
    ]
    try:
        result = browser(
            "secondPass",
            baseUrl=console_server,
            email=email,
            password=password,
            failedId=str(failed.pk),
            liveId=str(live.pk),
            readyFile=str(ready),
            cancelledFile=str(cancelled),
            stdout=stdout,
            pages=pages,
            docProgram="hello-doc",
            docSource=DOC_LIP,
        )
    finally:
        stop.set()
        thread.join(timeout=30)

    # The login form: focus in the address field; a refusal goes once the user types again.
    assert result["loginFocus"] == "username", result["loginFocus"]
    assert result["loginErrorAfterTyping"] == 0
    # Moving puts focus on the page heading; the focus ring stands out 3:1 from the page.
    assert result["focusAfterNav"] == "H1:Runs", result["focusAfterNav"]
    assert result["focusRingContrast"]["style"] != "none" and result["focusRingContrast"]["min"] >= 3, result
    # A failed run's heading names the exception, not a line of source.
    assert result["errorSummary"] == "ValueError: deliberate failure in step 3", result["errorSummary"]
    assert result["streamed"].startswith("1 event ·"), result["streamed"]
    assert result["firstTokenLabels"] == 1 and result["firstToken"] == "2.40 s after the run was created", result
    # Amounts to the micro-dollar everywhere; the invoice's days sum to its total, the lines too,
    # and the breakdown's costs to the range's.
    micro = r"\d+\.\d{6}"
    assert re.fullmatch(micro + " USD", result["failedRunCost"]), result["failedRunCost"]
    assert re.fullmatch(micro + " USD", result["invoiceTotal"]), result["invoiceTotal"]
    total = Decimal(result["invoiceTotal"].split()[0])
    assert all(re.fullmatch(micro, amount) for amount in result["invoiceLines"]), result["invoiceLines"]
    assert sum(Decimal(a) for a in result["invoiceLines"]) == total
    assert result["invoiceDays"] and sum(Decimal(amount) for _, _, amount in result["invoiceDays"]) == total
    today = next(row for row in result["invoiceDays"] if row[0] == timezone.now().date().isoformat())
    assert today[1] == "1" and today[2] == result["failedRunCost"].split()[0], today  # the failed run's day
    range_cost = Decimal(re.search(r"(" + micro + r") USD in", result["usageTotals"]).group(1))
    assert sum(Decimal(c) for c in result["groupCosts"]) == range_cost > 0, result
    # The run's KV panel: this run's pages and its tenant's, no worker totals.
    assert (result["kvRunPages"], result["kvTenantDevice"], result["kvTenantHost"]) == ("3", "11", "2"), result
    assert "Device pages" not in result["kvPanelText"]
    # Cancel asks first; a cancel asked for reads as one, with no traceback, also after a reload.
    assert result["statusWhileAsking"] == "running", result["statusWhileAsking"]
    assert result["cancelledNotice"].startswith("Cancelled by you at "), result["cancelledNotice"]
    assert result["cancelledNoticeReloaded"] == result["cancelledNotice"]
    assert result["cancelledErrors"] == 0 and result["cancelledAlerts"] == 0, result
    assert "ECONNLOST" not in result["cancelledPageText"]
    live.refresh_from_db()
    assert live.status == "cancelled" and live.exit_code == -15
    # An ended session: said in words, no Retry, the header knows; after signing in again the
    # page loads, and a form keeps what was typed on the same page.
    assert result["expiredDialog"] == "Your session expired — sign in again"
    assert result["expiredBanner"] == "Your session expired — sign in again", result["expiredBanner"]
    assert result["expiredRetry"] == 0
    assert result["expiredHeader"] == "Session expired"
    assert result["runsAfterRenew"] >= 3
    assert result["formBanner"] == "Your session expired — sign in again"
    assert result["samePage"] and result["nameKept"] == "written-before-expiry" and result["scopeKept"] is False
    from api.models import ApiKey

    key = ApiKey.objects.get(tenant=tenant, name="written-before-expiry")
    assert "runs" not in key.scopes
    assert all(result["scopesAfterCreate"]), result["scopesAfterCreate"]
    # The docstring's first paragraph describes the program; runs carry names.
    assert result["programLede"].startswith("Greets someone by name, twice over."), result["programLede"]
    assert Program.objects.get(tenant=tenant, name="hello-doc").description == "Greets someone by name, twice over."
    assert result["defaultName"] == "hello-doc Ada Lovelace", result["defaultName"]
    assert result["givenName"] == "nightly check"
    assert {"hello-doc Ada Lovelace", "nightly check"} <= set(result["listNames"]), result["listNames"]
    assert set(Run.objects.filter(program_version__program__name="hello-doc").values_list("name", flat=True)) == {
        "hello-doc Ada Lovelace",
        "nightly check",
    }
    # Phones: no page is wider than the screen.
    assert result["widths"] == {path: [390, 390] for path in pages}, result["widths"]


@pytest.mark.integration
@pytest.mark.docker
@pytest.mark.vllm
@pytest.mark.slow
def test_the_example_the_console_offers_streams_token_by_token(symphony_stack, browser):
    """Try an example → Run on the real stack (sandbox, worker, Redis, SSE): its text arrives
    as one event per decoded piece while the run is going, not once at its end."""
    from django.contrib.auth import get_user_model

    from api.models import Membership, Run, Tenant

    tenant = Tenant.objects.create(name="Example Co", slug="example-co")
    user = get_user_model().objects.create_user(
        username="example@example.com", email="example@example.com", password="pw-example-12345"
    )
    Membership.objects.create(user=user, tenant=tenant, role="owner")
    result = browser(
        "tryExample",
        timeout=400,
        baseUrl=symphony_stack,
        email="example@example.com",
        password="pw-example-12345",
        runTimeoutMs=300000,
    )
    assert result["status"] == "succeeded", result
    run = Run.objects.get(tenant=tenant)
    assert run.result["text"] and result["text"] == run.result["text"], result
    # One streamed event per decoded piece (24 tokens asked for), seen growing while running.
    assert result["chunks"] >= 10, result
    assert len(result["countsWhileRunning"]) >= 2, result
