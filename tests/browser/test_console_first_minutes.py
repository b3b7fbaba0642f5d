"""The console as a newcomer, an operator and someone following runs sees it, in real Chromium
against the real server (scenarios ``staffSignIn``, ``firstMinutes`` and ``follow`` of
tests/browser/console.mjs). Phone-width checks (390 px) run inside each scenario."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import pytest

from tests.browser.test_console import _seed_tenant

pytestmark = pytest.mark.browser


@pytest.fixture(autouse=True)
def _fresh_throttle_counters():
    """Sign-in and sign-up share the per-address ``auth`` throttle (see test_console.py)."""
    from django.core.cache import cache

    cache.clear()


def test_the_operator_signs_in_with_what_make_up_prints_and_manages_tenants(
    console_server, browser, settings, tmp_path
):
    from django.core.management import call_command

    from api.models import AuditLog, Plan, Tenant

    settings.VAR_DIR = tmp_path
    call_command("create_demo")
    first = (tmp_path / "admin-credentials.txt").read_text().splitlines()[0]
    password = (tmp_path / "admin-credentials.txt").read_text().split("Admin password: ")[1].strip()
    assert first == "Sign in as: admin (or admin@localhost)", first
    for name in ("free", "pro"):
        Plan.objects.get_or_create(name=name)
    Tenant.objects.create(name="Acme Co", slug="acme-co")
    Tenant.objects.create(name="Spam Co", slug="spam-co")

    result = browser(
        "staffSignIn",
        baseUrl=console_server,
        username="admin",
        email="admin@localhost",
        password=password,
        planTenant="acme-co",
        newPlan="pro",
        closeTenant="spam-co",
    )
    assert result["landed"] == "/staff", result
    assert result["openHref"] == f"/admin/api/tenant/{Tenant.objects.get(slug='acme-co').pk}/change/"
    assert "Django" in result["adminTitle"] or "administration" in result["adminTitle"], result["adminTitle"]
    assert Tenant.objects.get(slug="acme-co").plan == "pro"
    assert Tenant.objects.get(slug="spam-co").closed_at is not None
    assert AuditLog.objects.filter(action="tenant.close", target="spam-co", detail__by_staff=True).exists()


def test_a_newcomer_tries_the_example_and_reads_errors_next_to_fields(mail_stack, browser, tmp_path):
    """The newcomer verifies their address through the mailed link (the console says to) before
    uploading: the mail stack delivers it."""
    from api.models import Program, Run
    from tests.plugins.mail import verification_link_file

    email = f"newcomer-{uuid.uuid4().hex[:8]}@example.com"
    result = browser(
        "firstMinutes",
        baseUrl=mail_stack.url,
        verifyLinkFile=str(verification_link_file(mail_stack, email, tmp_path / "verify-link")),
        email=email,
        password="pw-first-five-minutes-1",
        tenant="Newcomers",
        tooLarge=2 * 1024 * 1024,
    )
    assert result["tagline"].startswith("Run LLM inference programs"), result["tagline"]
    assert "too common" in result["passwordError"] and result["passwordInvalid"] == "true", result
    assert result["sizeError"] == "huge.py is 2.0 MiB; programs can be at most 1.0 MiB.", result["sizeError"]
    assert result["postsForHugeFile"] == 0
    assert "must not contain '/'" in result["nameError"], result["nameError"]
    assert result["exampleArgs"] == {"prompt": "The capital of France is", "max_tokens": 24}
    assert result["maxTokensError"] == "Max tokens can be at most 4,096 tokens on this tenant's plan."
    assert result["lineNumberContrast"] >= 4.5, result["lineNumberContrast"]

    program = Program.objects.get(name="completion-example")
    assert program.default_args == {"prompt": "The capital of France is", "max_tokens": 24}
    assert not Program.objects.filter(name__contains="/").exists()
    assert not Run.objects.exists()  # the over-limit request created nothing


LONG_KV_NAME = "conversation-" + "x" * 115  # 128 characters


def _wait_for(path: Path, stop: threading.Event, timeout: float = 90) -> bool:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if stop.is_set() or time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _cancel_when_asked(run_id: str, signal: Path, stop: threading.Event) -> None:
    """Cancels a run through the service the API's cancel uses, when the browser asks."""
    from api.models import Run
    from api.services.runs import cancel_run

    if _wait_for(signal, stop):
        cancel_run(Run.objects.get(pk=run_id))


def _stream_then_record(run_id: str, ready: Path, cancelled: Path, stdout: str, stop: threading.Event) -> None:
    """Tokens and KV samples as the worker publishes them until the console cancels the run,
    then the executor's late outcome with the program's stdout (after the stream's end)."""
    from api.services.runs import RunOutcome, finish_run, publish_event
    from gpu_worker.contracts import KvEvent, TokenEvent

    if not _wait_for(ready, stop):
        return
    i = 0
    while not cancelled.exists() and not stop.is_set() and i < 600:
        publish_event(run_id, TokenEvent(f" w{i}"))
        publish_event(
            run_id,
            KvEvent(run_pages=3 + i, tenant_device_pages=10 + i, tenant_host_pages=2, tokens=5 + i),
        )
        i += 1
        time.sleep(0.15)
    if stop.is_set():
        return
    finish_run(run_id, RunOutcome(status="cancelled", result=None, error="", exit_code=-15, usage={}, stdout=stdout))


def test_runs_can_be_followed_and_read_on_a_phone(console_server, browser, tmp_path):
    from django.utils import timezone

    from api.models import KVFile, Program, Run
    from api.services.programs import add_version

    email, password, waiting = _seed_tenant()
    tenant = waiting.tenant
    version = waiting.program_version
    add_version(Program.objects.create(tenant=tenant, name="unused"), "u.py", b"def main(args):\n    return 1\n")
    traceback = (
        "Traceback (most recent call last):\n"
        '  File "/lip/story.py", line 9, in main\n'
        "    nxt = sy.pred_token(kv, [nxt])\n"
        "ZeroDivisionError: division by zero"
    )
    now = timezone.now()
    failed = Run.objects.create(
        tenant=tenant, program_version=version, status="failed", error=traceback, exit_code=1, started_at=now
    )
    Run.objects.filter(pk=failed.pk).update(finished_at=now)
    # A run the failed one spawned before it failed (symphony.spawn): its run tree links to it.
    child = Run.objects.create(
        tenant=tenant, program_version=version, status="succeeded", parent=failed, depth=1, entry="self:helper"
    )
    live = Run.objects.create(tenant=tenant, program_version=version, status="running", worker="local", started_at=now)
    KVFile.objects.create(
        tenant=tenant, worker="local", name=LONG_KV_NAME, tokens=64, bytes=64 * 36864, residency="host", last_used=0
    )
    signals = {name: tmp_path / name for name in ("cancel", "ready", "cancelled")}
    stdout = "printed by the program after its last token"
    stop = threading.Event()
    threads = [
        threading.Thread(target=_cancel_when_asked, args=(str(waiting.pk), signals["cancel"], stop), daemon=True),
        threading.Thread(
            target=_stream_then_record,
            args=(str(live.pk), signals["ready"], signals["cancelled"], stdout, stop),
            daemon=True,
        ),
    ]
    for thread in threads:
        thread.start()
    try:
        result = browser(
            "follow",
            baseUrl=console_server,
            email=email,
            password=password,
            runningId=str(waiting.pk),
            failedId=str(failed.pk),
            childId=str(child.pk),
            liveId=str(live.pk),
            otherProgram="unused",
            cancelFile=str(signals["cancel"]),
            readyFile=str(signals["ready"]),
            cancelledFile=str(signals["cancelled"]),
            stdout=stdout,
            longKvName=LONG_KV_NAME,
        )
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
    assert result["programCell"] == "story v1", result["programCell"]
    assert result["listUpdatedMs"] < 6000, result  # polled, not on reload
    assert result["filteredStatuses"] and set(result["filteredStatuses"]) == {"failed"}, result["filteredStatuses"]
    assert result["traceback"] == traceback
    assert result["spawnedByParent"] == [str(child.pk)[:8]], result["spawnedByParent"]
    assert result["tracebackWhiteSpace"] == "pre"
    assert result["firstTokenLive"] == result["firstTokenReloaded"], result
    assert len(result["xTicks"]) == 3 and all(t.endswith(" s") for t in result["xTicks"]), result["xTicks"]
    assert result["kvTitle"] == LONG_KV_NAME
    assert 0 < result["kvNameWidth"] <= 390
