"""Accounts, not tenants, are the unit of abuse: through a real uvicorn (and, for mail, a real
Celery worker speaking SMTP to a sink), PostgreSQL and Redis.

- A sign-up whose address is not verified cannot mint API keys, upload programs or start runs;
  the link mailed to it (once) lifts that.
- Account pre-hijack: whoever signs up with someone else's address gets no key; and when the
  owner resets the password through the mailed link, every key minted before it stops working.
- Many addresses taking turns at one account's password lock it, with back-off; during a lock
  the right password is refused exactly like a wrong one.
- The tenant rate is a sliding window: a burst straddling a minute boundary is refused.
- One person's tenants share one bound on concurrent runs.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import httpx
import pytest
import requests
from django.contrib.auth import get_user_model
from django.core.cache import cache

from api import throttling
from api.models import ApiKey, AuditLog, Plan, Program, Run
from api.services import members, programs
from api.services.keys import issue_key
from api.tenancy import KEY_SCOPES
from tests.plugins.browser import child_env_for_test_db, start_uvicorn, stop
from tests.plugins.mail import MailStack, link_in, signed_up

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration, pytest.mark.timeout(180)]

PASSWORD, NEW_PASSWORD = "pw-correct-horse-1", "pw-battery-staple-2"
LIP = b"def main(args):\n    return args\n"


@pytest.fixture(autouse=True)
def _fresh_counters() -> Iterator[None]:
    cache.clear()  # throttles, lockouts and mail intervals: the shared Redis cache, also the server's
    yield
    cache.clear()


def _error(response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


def _verify_token(stack: MailStack, email: str) -> str:
    message = stack.smtp.wait_for(email, "Verify your Symphony email")
    return link_in(message, stack.url, "/verify-email/").rsplit("/", 1)[1]


# --- verified email before keys, programs and runs ----------------------------------------------


def test_an_unverified_sign_up_cannot_mint_keys_upload_or_run_until_it_opens_the_link(mail_stack):
    url, email = mail_stack.url, "grace@example.com"
    session = signed_up(url, email, PASSWORD, "Harvard Mark I")
    assert session.get(f"{url}/api/v1/auth/me").json()["user"]["email_verified"] is False

    key = session.post(f"{url}/api/v1/api-keys", json={"name": "ci"}, timeout=10)
    assert _error(key) == (403, "email_unverified")
    assert email in key.json()["error"]["message"] and "verify-email/resend" in key.json()["error"]["message"]
    upload = session.post(f"{url}/api/v1/programs", data={"name": "p"}, files={"file": ("p.py", LIP)}, timeout=10)
    assert _error(upload) == (403, "email_unverified")
    assert _error(session.post(f"{url}/api/v1/runs", json={"program": 1}, timeout=10)) == (403, "email_unverified")
    assert not ApiKey.objects.exists() and not Program.objects.exists() and not Run.objects.exists()

    # Resend is one mail a minute per account, however often it is pressed.
    first = session.post(f"{url}/api/v1/auth/verify-email/resend", timeout=10)
    again = session.post(f"{url}/api/v1/auth/verify-email/resend", timeout=10)
    assert (first.status_code, first.json()["sent"]) == (202, True)
    assert (again.status_code, again.json()["sent"]) == (202, False)

    token = _verify_token(mail_stack, email)
    opened = requests.post(f"{url}/api/v1/auth/verify-email", json={"token": token}, timeout=10)
    assert opened.status_code == 200, opened.text
    assert session.get(f"{url}/api/v1/auth/me").json()["user"]["email_verified"] is True
    assert session.post(f"{url}/api/v1/api-keys", json={"name": "ci"}, timeout=10).status_code == 201
    # The link works once.
    reused = requests.post(f"{url}/api/v1/auth/verify-email", json={"token": token}, timeout=10)
    assert reused.status_code == 400 and "already used" in reused.text


# --- account pre-hijack -------------------------------------------------------------------------


def test_a_sign_up_with_someone_elses_address_gets_no_key_and_the_owners_reset_takes_it_back(mail_stack):
    url, victim = mail_stack.url, "lise@example.com"
    attacker = signed_up(url, victim, PASSWORD, "Squatted")  # the attacker cannot read the mailbox
    assert _error(attacker.post(f"{url}/api/v1/api-keys", json={"name": "persist"}, timeout=10)) == (
        403,
        "email_unverified",
    )

    # The owner gets the reset link (their mailbox), sets a password; the attacker's session ends.
    requests.post(f"{url}/api/v1/auth/password-reset", json={"email": victim}, timeout=10)
    uid, token = link_in(mail_stack.smtp.wait_for(victim, "Reset"), url, "/reset-password/").split("/")[-2:]
    body = {"uid": uid, "token": token, "new_password": NEW_PASSWORD}
    assert requests.post(f"{url}/api/v1/auth/password-reset/confirm", json=body, timeout=10).status_code == 204
    assert attacker.get(f"{url}/api/v1/auth/me", timeout=10).status_code in (401, 403)
    owner = _signed_in(url, victim, NEW_PASSWORD)
    assert owner.get(f"{url}/api/v1/auth/me").json()["user"]["email_verified"] is True  # the link proved it
    assert owner.post(f"{url}/api/v1/api-keys", json={"name": "mine"}, timeout=10).status_code == 201


def test_a_key_minted_before_a_password_reset_stops_working_after_it(mail_stack):
    url, email = mail_stack.url, "emmy@example.com"
    user = get_user_model().objects.create_user(username=email, email=email, password=PASSWORD)
    tenant = members.create_tenant(user, "Erlangen")
    holder = _signed_in(url, email, PASSWORD)  # whoever held the password: its owner or not
    minted = holder.post(f"{url}/api/v1/api-keys", json={"name": "backdoor"}, timeout=10)
    assert minted.status_code == 201, minted.text
    bearer = {"Authorization": f"Bearer {minted.json()['secret']}"}
    assert requests.get(f"{url}/api/v1/programs", headers=bearer, timeout=10).status_code == 200

    requests.post(f"{url}/api/v1/auth/password-reset", json={"email": email}, timeout=10)
    uid, token = link_in(mail_stack.smtp.wait_for(email, "Reset"), url, "/reset-password/").split("/")[-2:]
    body = {"uid": uid, "token": token, "new_password": NEW_PASSWORD}
    assert requests.post(f"{url}/api/v1/auth/password-reset/confirm", json=body, timeout=10).status_code == 204

    assert requests.get(f"{url}/api/v1/programs", headers=bearer, timeout=10).status_code == 401
    assert holder.get(f"{url}/api/v1/auth/me", timeout=10).status_code in (401, 403)
    audit = AuditLog.objects.get(tenant=tenant, action="api_key.revoke")
    assert audit.detail["reason"] == "password_reset" and "backdoor" in audit.target


def _signed_in(url: str, email: str, password: str) -> requests.Session:
    session = requests.Session()
    token = session.get(f"{url}/api/v1/auth/csrf", timeout=10).json()["csrftoken"]
    session.headers.update({"X-CSRFToken": token, "Referer": url})
    response = session.post(f"{url}/api/v1/auth/login", json={"email": email, "password": password}, timeout=10)
    assert response.status_code == 200, response.text
    session.headers["X-CSRFToken"] = session.cookies["csrftoken"]
    return session


# --- per-account sign-in lockout ----------------------------------------------------------------

FIRST_LOCK_S = 2  # SYMPHONY_LOGIN_LOCK_FIRST_S of the server below (60 by default)
LOCK_AFTER = 10  # SYMPHONY_LOGIN_LOCK_AFTER's default (web/settings.py)


@pytest.fixture
def quick_lock_server() -> Iterator[str]:
    proc, url = start_uvicorn({**child_env_for_test_db(), "SYMPHONY_LOGIN_LOCK_FIRST_S": str(FIRST_LOCK_S)})
    yield url
    stop(proc, timeout=10)


@contextlib.contextmanager
def _from(url: str, source: str) -> Iterator[httpx.Client]:
    """A console client connecting from ``source`` (all of 127/8 is the loopback)."""
    with httpx.Client(base_url=url, transport=httpx.HTTPTransport(local_address=source), timeout=10) as client:
        client.headers["X-CSRFToken"] = client.get("/api/v1/auth/csrf").json()["csrftoken"]
        yield client


def _login(url: str, source: str, email: str, password: str) -> httpx.Response:
    with _from(url, source) as client:
        return client.post("/api/v1/auth/login", json={"email": email, "password": password})


def test_wrong_passwords_from_many_addresses_lock_the_account_with_back_off(quick_lock_server):
    url, email = quick_lock_server, "ada@example.com"
    get_user_model().objects.create_user(username=email, email=email, password=PASSWORD)
    guesses = [
        _login(url, f"127.0.0.{i % 5 + 1}", email.upper() if i % 2 else email, f"guess-{i}") for i in range(LOCK_AFTER)
    ]
    # Five addresses, two guesses each: each address is far below its own throttle.
    assert [r.status_code for r in guesses] == [401] * (LOCK_AFTER - 1) + [429]

    right = _login(url, "127.0.0.6", email, PASSWORD)
    wrong = _login(url, "127.0.0.7", email, "guess-again")
    assert right.status_code == wrong.status_code == 429
    assert right.json() == wrong.json()  # nothing tells whether the password was right
    assert right.json()["error"]["code"] == "account_locked"
    assert 1 <= int(right.headers["Retry-After"]) <= FIRST_LOCK_S

    time.sleep(FIRST_LOCK_S + 0.2)
    after = _login(url, "127.0.0.8", email, "one-more-guess")  # the first failure after a lock
    assert after.status_code == 429 and int(after.headers["Retry-After"]) == 2 * FIRST_LOCK_S  # doubled
    assert _login(url, "127.0.0.6", email, PASSWORD).status_code == 429
    time.sleep(2 * FIRST_LOCK_S + 0.2)
    assert _login(url, "127.0.0.6", email, PASSWORD).status_code == 200
    # A success starts the count afresh: one wrong password is a plain 401 again.
    assert _login(url, "127.0.0.9", email, "typo").status_code == 401


# --- sliding-window tenant rate -----------------------------------------------------------------


def test_a_burst_straddling_a_minute_boundary_is_refused(api_tenant_a, monkeypatch):
    """The attack was 640 requests in 15 s across a minute boundary on a 600/min plan. Times are
    given to the real Redis script; the counts are what it answered."""
    limit = 600
    Plan.objects.update_or_create(name="burst", defaults={"api_requests_per_minute": limit})
    api_tenant_a.tenant.plan = "burst"
    api_tenant_a.tenant.save(update_fields=["plan"])
    now = [0.0]
    monkeypatch.setattr(throttling.time, "time", lambda: now[0])
    boundary = 60.0 * 29_000_000  # a minute boundary
    accepted = []
    for i in range(640):  # 15 s, half of it before the boundary
        now[0] = boundary - 7.5 + 15 * i / 640
        try:
            throttling.check_tenant_rate(api_tenant_a.tenant)
            accepted.append(now[0])
        except throttling.TenantThrottled as refused:
            assert 1 <= refused.retry_after <= 60
    # A fixed window accepted all 640: 320 before the boundary, and a fresh 600 after it.
    assert len(accepted) == limit
    assert len([t for t in accepted if t < boundary]) == 320
    assert len([t for t in accepted if t >= boundary]) == limit - 320

    # Still refused just before the first accepted request is 60 s old; exactly then one slot frees.
    now[0] = accepted[0] + 59.9
    with pytest.raises(throttling.TenantThrottled):
        throttling.check_tenant_rate(api_tenant_a.tenant)
    now[0] = accepted[0] + 60
    state = throttling.check_tenant_rate(api_tenant_a.tenant)
    assert state is not None and state.remaining == 0


# --- one account, many tenants ------------------------------------------------------------------


def test_concurrent_runs_are_capped_across_every_tenant_one_person_created(api_asgi_server, api_tenant_b):
    user = get_user_model().objects.create_user(username="kat@example.com", email="kat@example.com", password=PASSWORD)
    first, second = members.create_tenant(user, "First"), members.create_tenant(user, "Second")
    cap = 2
    Plan.objects.update_or_create(name="free", defaults={"max_concurrent_runs": cap})  # each tenant's plan

    def start(tenant) -> httpx.Response:
        program = Program.objects.create(tenant=tenant, name=f"p-{Program.objects.count()}")
        programs.add_version(program, "p.py", LIP)
        secret = issue_key(tenant, "k", list(KEY_SCOPES), user).secret
        with httpx.Client(base_url=api_asgi_server, headers={"Authorization": f"Bearer {secret}"}) as client:
            return client.post("/api/v1/runs", json={"program": program.pk})

    assert [start(first).status_code for _ in range(cap)] == [201] * cap
    refused = start(second)  # a tenant of its own, with free slots of its own: the account has none
    assert _error(refused) == (429, "quota_exceeded")
    assert f"your account allows {cap} concurrent runs across all the tenants" in refused.json()["error"]["message"]
    assert Run.objects.filter(tenant__account=user).count() == cap
    other = api_tenant_b.tenant  # another account is untouched
    assert start(other).status_code == 201
