"""The React console in real headless Chromium against the real server (uvicorn + PostgreSQL +
Redis on the test database). Scenarios live in tests/browser/console.mjs."""

from __future__ import annotations

import re
import threading
import time
import uuid

import pytest

pytestmark = pytest.mark.browser


@pytest.fixture(autouse=True)
def _fresh_throttle_counters():
    """Sign-up, log-in and the password-reset and email-change routes share the ``auth`` throttle
    (per address, so every scenario here counts against 127.0.0.1), whose Redis counters outlive a
    test: each test starts with none spent, as the password-reset one alone spends about eight."""
    from django.core.cache import cache

    cache.clear()


HELLO_LIP = '''"""Greets without the model: enough for upload, listing and the code viewer."""


def main(args):
    return {"greeting": "hello " + str(args.get("name", "world"))}
'''


def test_console_is_served_for_client_routes(console_server):
    import urllib.request

    for route in ("/", "/programs", "/runs/00000000-0000-0000-0000-000000000000", "/usage"):
        with urllib.request.urlopen(console_server + route) as resp:
            body = resp.read().decode()
            assert resp.status == 200
            assert '<div id="root">' in body
            asset = re.search(r'src="(/static/assets/[^"]+\.js)"', body).group(1)
    with urllib.request.urlopen(console_server + asset) as resp:
        assert resp.status == 200
        assert "javascript" in resp.headers["Content-Type"]


def test_tenant_signs_up_uploads_and_manages_keys(mail_stack, browser, tmp_path):
    """Through the mail stack: the console's sign-up must be verified through the mailed link
    before it may upload or mint keys."""
    from tests.plugins.mail import verification_link_file

    console_server = mail_stack.url
    email = f"ada-{uuid.uuid4().hex[:8]}@example.com"
    result = browser(
        "tenant",
        baseUrl=console_server,
        verifyLinkFile=str(verification_link_file(mail_stack, email, tmp_path / "verify-link")),
        email=email,
        password="pw-correct-horse-1",
        tenant="Analytical Engines",
        programName="hello-lip",
        programSource=HELLO_LIP,
        inviteEmail="babbage@example.com",
    )
    # The key authenticated the REST API until it was revoked in the console.
    assert result["keyStatusBefore"] == 200
    assert result["keyStatusAfter"] == 401

    from api.models import ApiKey, Invitation, Program

    program = Program.objects.get(name="hello-lip")
    assert program.tenant.name == "Analytical Engines"
    assert bytes(program.versions.get(number=1).content).decode() == HELLO_LIP
    key = ApiKey.objects.get(prefix=result["prefix"])
    assert key.revoked_at is not None

    # The owner's invitation link was shown once, then revoked in the console.
    assert result["inviteLink"].startswith(console_server + "/invite/inv_")
    # The server queued the link's mail too (Redis, the broker, is up), and the page says so.
    assert result["inviteMail"] == "We emailed this link to babbage@example.com.", result["inviteMail"]
    invitation = Invitation.objects.get(email="babbage@example.com", tenant=program.tenant)
    assert invitation.revoked_at is not None and invitation.accepted_at is None


def test_an_invitee_signs_up_through_the_link_joins_as_member_and_leaves(console_server, browser):
    """The other half of the team flow above: the person the owner passed the link to."""
    from django.contrib.auth import get_user_model

    from api.models import AuditLog, Membership, Program, Tenant
    from api.services import members, programs

    owner = get_user_model().objects.create_user(
        username="lovelace@example.com", email="lovelace@example.com", password="pw-owner-12345"
    )
    tenant = Tenant.objects.create(name="Difference Engines", slug="difference")
    Membership.objects.create(user=owner, tenant=tenant, role="owner")
    programs.add_version(Program.objects.create(tenant=tenant, name="shared-lip"), "p.py", HELLO_LIP.encode())
    issued = members.invite(owner, tenant, "babbage@example.com", "member")

    result = browser(
        "join",
        baseUrl=console_server,
        inviteLink=f"{console_server}/invite/{issued.token}",
        tenant="Difference Engines",
        email="babbage@example.com",
        password="pw-invitee-12345",
        ownerEmail="lovelace@example.com",
        programName="shared-lip",
    )
    assert result["myRole"].strip() == "member", result
    assert "owner" in result["ownerRow"], result
    assert result["inviteControls"] == 0 and result["roleSelects"] == 0, result  # members see, owners manage

    joined = get_user_model().objects.get(username="babbage@example.com")
    assert joined.check_password("pw-invitee-12345")
    assert not Membership.objects.filter(tenant=tenant, user=joined).exists()  # left
    actions = list(AuditLog.objects.filter(tenant=tenant).order_by("id").values_list("action", flat=True))
    assert actions[-2:] == ["invitation.accept", "member.leave"], actions


def test_an_owner_closes_a_tenant_and_the_console_moves_to_their_other_one(console_server, browser):
    from django.contrib.auth import get_user_model

    from api.models import AuditLog, Membership, Program, Tenant
    from api.services import programs

    owner = get_user_model().objects.create_user(
        username="hopper@example.com", email="hopper@example.com", password="pw-owner-12345"
    )
    closing = Tenant.objects.create(name="Mark I", slug="mark-i")
    staying = Tenant.objects.create(name="UNIVAC", slug="univac")
    for tenant, program in ((closing, "ballistics"), (staying, "payroll")):
        Membership.objects.create(user=owner, tenant=tenant, role="owner")  # Mark I first: active at sign-in
        programs.add_version(Program.objects.create(tenant=tenant, name=program), "p.py", HELLO_LIP.encode())

    result = browser(
        "close",
        baseUrl=console_server,
        email="hopper@example.com",
        password="pw-owner-12345",
        tenantName="Mark I",
        slug="mark-i",
        closingProgram="ballistics",
        stayingProgram="payroll",
    )
    assert result["armedByName"] is False and result["tenantShown"] == "UNIVAC", result
    closing.refresh_from_db()
    assert closing.closed_at is not None and not Membership.objects.filter(tenant=closing).exists()
    assert AuditLog.objects.filter(tenant=closing, action="tenant.close", actor=owner).exists()
    assert Membership.objects.filter(tenant=staying, user=owner, role="owner").exists()


def test_a_forgotten_password_is_reset_in_the_console_through_the_mailed_link(mail_stack, browser):
    """Forgot password → the mail a real Celery worker sent over SMTP → its link opened in the
    console → new password → the login page says so → the new password logs in. The old password
    and the spent link stop working, and a "password was changed" mail follows."""
    import requests
    from django.contrib.auth import get_user_model

    from tests.plugins.mail import link_in, login_status, signed_up

    url, smtp = mail_stack.url, mail_stack.smtp
    email = f"curie-{uuid.uuid4().hex[:8]}@example.com"
    old_password, new_password = "pw-polonium-1898", "radium-glows-in-the-dark-1902"
    signed_up(url, email, old_password, "Radium Institute")  # over HTTP, as the console does

    asked = browser("forgotPassword", baseUrl=url, email=email)
    assert asked["confirmation"] == (
        f"If an account uses {email}, we sent a link to reset its password. It is valid for an hour."
    )

    link = link_in(smtp.wait_for(email, "Reset your Symphony password"), url, "/reset-password/")
    uid, token = re.fullmatch(re.escape(url) + r"/reset-password/([^/]+)/([^/]+)", link).groups()
    reset = browser("resetPassword", baseUrl=url, resetLink=link, email=email, newPassword=new_password)
    assert reset["notice"] == "Your password was changed. Log in with the new one."
    assert reset["landed"] == "/programs"

    user = get_user_model().objects.get(email=email)
    assert user.check_password(new_password)
    assert login_status(url, email, old_password) == 401
    assert login_status(url, email, new_password) == 200
    # The link worked once: the token died with the old password.
    again = requests.post(
        f"{url}/api/v1/auth/password-reset/confirm",
        json={"uid": uid, "token": token, "new_password": "another-fresh-secret-77"},
        timeout=10,
    )
    assert again.status_code == 400, again.text
    assert "already used" in again.json()["error"]["detail"]["token"][0]

    changed = smtp.wait_for(email, "password was changed")
    assert link_in(changed, url, "/forgot-password")
    assert len([m for m in smtp.to(email) if "Reset" in m["Subject"]]) == 1


def test_a_signed_in_user_changes_their_email_through_the_link_mailed_to_the_new_address(mail_stack, browser):
    """Account page → new address and password → the confirmation mail a real Celery worker sent
    over SMTP to the new address → its link opened in a console signed in with the old one → the
    header shows the new address. From then on only the new address signs in, the old one is
    told, and the spent link is refused."""
    import requests
    from django.contrib.auth import get_user_model

    from tests.plugins.mail import link_in, login_status, signed_up

    url, smtp = mail_stack.url, mail_stack.smtp
    suffix = uuid.uuid4().hex[:8]
    old, new = f"meitner-{suffix}@example.com", f"lise-{suffix}@physics.example"
    password = "pw-fission-1938"
    signed_up(url, old, password, "Kaiser Wilhelm Institute")  # over HTTP, as the console does
    user = get_user_model().objects.get(username=old)

    asked = browser("changeEmail", baseUrl=url, email=old, password=password, newEmail=new)
    assert asked["notice"] == f"We sent a link to {new}. Your address changes when you open it (valid 24 hours)."
    user.refresh_from_db()
    assert (user.email, user.username) == (old, old)  # nothing changes before the link is opened

    link = link_in(smtp.wait_for(new, "Confirm your new Symphony email address"), url, "/confirm-email/")
    token = re.fullmatch(re.escape(url) + r"/confirm-email/([A-Za-z0-9:_-]+)", link).group(1)
    confirmed = browser("confirmEmail", baseUrl=url, confirmLink=link, email=old, password=password)
    assert confirmed["notice"] == f"Your account now signs in with {new}."
    assert confirmed["header"] == new, confirmed
    assert confirmed["account"] == new, confirmed

    user.refresh_from_db()
    assert (user.email, user.username) == (new, new)
    assert user.check_password(password)
    assert login_status(url, new, password) == 200
    assert login_status(url, old, password) == 401

    told = smtp.wait_for(old, "Your Symphony account has a new email address")
    assert new in told.get_body(preferencelist=("plain",)).get_content()
    # The link worked once: it names the address it replaces, which is gone now.
    again = requests.post(f"{url}/api/v1/auth/email/confirm", json={"token": token}, timeout=10)
    assert again.status_code == 400, again.text
    assert "already used" in again.json()["error"]["detail"]["token"][0]
    assert len([m for m in smtp.to(new) if "Confirm" in m["Subject"]]) == 1
    assert not [m for m in smtp.to(old) if "Confirm" in m["Subject"]]


def test_the_content_security_policy_blocks_injected_script_and_breaks_no_page(console_server, browser):
    """Real Chromium: the console, the admin's login page, Swagger UI and DRF's browsable API
    load with no policy violation (each scenario also fails on any CSP console error), and a
    script injected inline into the console is refused instead of run (web/csp.py)."""
    result = browser("csp", baseUrl=console_server)
    assert result["inlineRan"] is False
    assert result["blocked"] == ["script-src-elem"], result
    assert result["visited"] == {"admin": [], "swagger": [], "browsable": []}, result


def test_staff_sees_admin_page(console_server, browser):
    from django.contrib.auth import get_user_model

    from api.models import Membership, Tenant

    ops = Tenant.objects.create(name="Operators", slug="operators")
    Tenant.objects.create(name="Customer Co", slug="customer-co")
    staff = get_user_model().objects.create_user(
        username="ops@example.com", email="ops@example.com", password="pw-staff-12345", is_staff=True
    )
    Membership.objects.create(user=staff, tenant=ops, role="owner")
    browser(
        "staff",
        baseUrl=console_server,
        email="ops@example.com",
        password="pw-staff-12345",
        expectTenants=["operators", "customer-co"],
    )


STORY_LIP = '''"""Streams a short continuation of a prompt, one token at a time, keeping its KV as a file."""

import symphony as sy


def main(args):
    kv = sy.kv_create(args.get("kv_name", "story-prefix"))
    nxt = sy.pred_token(kv, sy.tokenize(args.get("prompt", "Once upon a time")))
    out = []
    for _ in range(int(args.get("max_tokens", 24))):
        out.append(nxt)
        sy.send_to_user(sy.detokenize([nxt]))
        nxt = sy.pred_token(kv, [nxt])
    sy.kv_close(kv)
    return {"tokens": len(out), "text": sy.detokenize(out)}
'''

WORDS = ["Once", " upon", " a", " time", ",", " a", " program", " served", " tokens", " live", "."]


def _seed_tenant():
    """A staff owner of tenant 'acme' with a program, finished runs with usage on earlier days,
    mirrored KV files and one running run; returns (user email, password, running run)."""
    from datetime import timedelta

    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from api.models import KVFile, Membership, Program, Run, Tenant, UsageRecord
    from api.services.programs import add_version

    tenant = Tenant.objects.create(name="Acme Research", slug="acme")
    Tenant.objects.create(name="Beta Labs", slug="beta")
    user = get_user_model().objects.create_user(
        username="grace@example.com", email="grace@example.com", password="pw-acme-12345", is_staff=True
    )
    Membership.objects.create(user=user, tenant=tenant, role="owner")
    program = Program.objects.create(tenant=tenant, name="story", description="Streams a story")
    version = add_version(program, "story.py", STORY_LIP.encode())
    now = timezone.now()
    for days_ago, (prefill, decode) in enumerate([(900, 2400), (400, 1300), (1500, 3100), (0, 0), (700, 900)]):
        if not prefill:
            continue
        when = now - timedelta(days=days_ago + 1)
        run = Run.objects.create(
            tenant=tenant, program_version=version, status="succeeded", args={"prompt": "Hi"}, result={"tokens": decode}
        )
        Run.objects.filter(pk=run.pk).update(created_at=when, started_at=when, finished_at=when + timedelta(seconds=3))
        usage = UsageRecord.objects.create(
            tenant=tenant, run=run, prefill_tokens=prefill, decode_tokens=decode, pred_calls=decode, page_seconds=42.5
        )
        UsageRecord.objects.filter(pk=usage.pk).update(created_at=when)
    for name, tokens, residency, pinned in [
        ("story-prefix", 1536, "device", True),
        ("chat-history", 412, "host", False),
    ]:
        KVFile.objects.create(
            tenant=tenant,
            worker="local",
            name=name,
            tokens=tokens,
            bytes=tokens * 36864,
            residency=residency,
            pinned=pinned,
            last_used=now.timestamp() - 300,
        )
    running = Run.objects.create(
        tenant=tenant,
        program_version=version,
        status="running",
        worker="local",
        args={"prompt": "Once upon a time"},
        started_at=now,
    )
    return "grace@example.com", "pw-acme-12345", running


def _publish_run(run_id: str, ready_file, stop: threading.Event) -> None:
    """What the worker and executor do during a run: token and kv events on the run's Redis
    stream, then finish_run (status + end events, usage)."""
    from api.services.runs import RunOutcome, finish_run, publish_event
    from gpu_worker.contracts import KvEvent, TokenEvent

    deadline = time.monotonic() + 60
    while not ready_file.exists() and time.monotonic() < deadline and not stop.is_set():
        time.sleep(0.05)
    for i, word in enumerate(WORDS):
        if stop.is_set():
            return
        publish_event(run_id, TokenEvent(word))
        publish_event(
            run_id,
            KvEvent(
                run_pages=6 + i,
                tenant_device_pages=40 + 3 * i,
                tenant_host_pages=8 + i // 3,
                tokens=5 + i,
            ),
        )
        time.sleep(0.15)
    finish_run(
        run_id,
        RunOutcome(
            status="succeeded",
            result={"tokens": len(WORDS), "text": "".join(WORDS)},
            exit_code=0,
            usage={"prefill_tokens": 5, "decode_tokens": len(WORDS), "pred_calls": len(WORDS)},
        ),
    )


def test_live_run_view_and_populated_pages(console_server, browser, tmp_path):
    """The run page follows the real SSE endpoint while events are published to Redis the way
    the worker publishes them; usage, invoices, KV files and admin render seeded data."""
    email, password, run = _seed_tenant()
    ready = tmp_path / "ready"
    stop = threading.Event()
    publisher = threading.Thread(target=_publish_run, args=(str(run.pk), ready, stop), daemon=True)
    publisher.start()
    try:
        result = browser(
            "populated",
            baseUrl=console_server,
            email=email,
            password=password,
            runId=str(run.pk),
            readyFile=str(ready),
            kvTenant="acme",
            kvName="chat-history",
            programName="story",
        )
    finally:
        stop.set()
        publisher.join(timeout=30)
    assert result["status"] == "succeeded"
    assert result["text"] == "".join(WORDS)
    assert result["liveSteps"] >= 3, "tokens should appear in several steps, not all at the end"
    assert result["kvChart"] == 1
    assert '"tokens": 11' in result["result"]
    assert "runs" in result["usage"] and not result["usage"].startswith("0 tokens")
    # 4 seeded runs and the one just streamed: 7,700 + 11 decode tokens
    assert result["byProgram"].startswith("story5") and "7,711" in result["byProgram"], result["byProgram"]
    assert result["stale"] == 1  # no worker in this test: the KV mirror is served stale


@pytest.mark.integration
@pytest.mark.docker
@pytest.mark.vllm
@pytest.mark.slow
def test_real_run_streams_tokens_live_and_staff_evicts(symphony_stack, browser):
    """End to end with a real run: console → API → Celery → gVisor sandbox → gpu_worker → Redis
    → SSE → console. Tokens appear live, the KV panel fills, usage counts the tokens, and a staff
    user evicts the KV file the run left behind and reads the worker's engine timeline."""
    from django.contrib.auth import get_user_model

    from api.models import AuditLog, KVFile, Membership, Program, Tenant
    from api.services.programs import add_version

    tenant = Tenant.objects.create(name="Live Co", slug="live-co")
    user = get_user_model().objects.create_user(
        username="live@example.com", email="live@example.com", password="pw-live-12345", is_staff=True
    )
    Membership.objects.create(user=user, tenant=tenant, role="owner")
    program = Program.objects.create(tenant=tenant, name="story", description="Streams a story")
    add_version(program, "story.py", STORY_LIP.encode())

    result = browser(
        "run",
        timeout=400,
        baseUrl=symphony_stack,
        email="live@example.com",
        password="pw-live-12345",
        programName="story",
        args={"prompt": "Once upon a time", "max_tokens": 64, "kv_name": "story-e2e"},
        runTimeoutMs=300000,
    )
    assert result["status"] == "succeeded", result
    assert result["text"].strip(), "no streamed text"
    assert result["liveSteps"] >= 2, "tokens should appear while the run is going, not only at its end"
    assert result["kvSamples"] == 1, "the KV panel got no kv events"
    assert not result["usage"].startswith("0 tokens"), result["usage"]

    assert KVFile.objects.filter(tenant=tenant, name="story-e2e").exists(), "run's KV file not mirrored"
    staff = browser(
        "evict",
        baseUrl=symphony_stack,
        email="live@example.com",
        password="pw-live-12345",
        kvTenant="live-co",
        kvName="story-e2e",
    )
    # Eviction spills the file out of device/host memory on the worker; the audit row is written
    # only after the worker confirmed it.
    assert AuditLog.objects.filter(tenant=tenant, action="kv_evict", target="story-e2e", actor=user).exists()
    # The staff page drew the worker's engine timeline: the run's forwards, how busy, the longest.
    assert staff["engineBars"] >= 2, staff
    assert staff["engineBusy"].endswith("%"), staff
    assert staff["engineLongest"].startswith("Longest forwards: at +"), staff
