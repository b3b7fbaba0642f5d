"""Mail through the real stack: an HTTP request to uvicorn queues a Celery task, a real Celery
worker renders the mail and delivers it over SMTP to a real server on 127.0.0.1, and the link in
the delivered mail does what it says (tests/plugins/mail.py)."""

from __future__ import annotations

import re
import uuid

import pytest
import requests

from tests.plugins.mail import link_in, login_status, signed_up

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

OLD, NEW = "pw-old-horse-1", "pw-new-battery-2"


def test_forgotten_password_is_reset_through_the_mailed_link(mail_stack):
    url, smtp = mail_stack.url, mail_stack.smtp
    email = f"ada-{uuid.uuid4().hex[:8]}@example.com"
    other_device = signed_up(url, email, OLD, "Analytical Engines")

    asked = requests.post(f"{url}/api/v1/auth/password-reset", json={"email": email.upper()}, timeout=10)
    assert asked.status_code == 202
    nobody = requests.post(f"{url}/api/v1/auth/password-reset", json={"email": "no-" + email}, timeout=10)
    assert nobody.status_code == 202 and nobody.json() == asked.json()

    message = smtp.wait_for(email, "Reset your Symphony password")
    assert message["From"] == "Symphony <noreply@localhost>"
    link = link_in(message, url, "/reset-password/")
    uid, token = re.fullmatch(re.escape(url) + r"/reset-password/([^/]+)/([^/]+)", link).groups()

    # The console serves the page the link opens.
    page = requests.get(link, timeout=10)
    assert page.status_code == 200 and '<div id="root">' in page.text

    confirm = {"uid": uid, "token": token, "new_password": NEW}
    assert requests.post(f"{url}/api/v1/auth/password-reset/confirm", json=confirm, timeout=10).status_code == 204
    assert login_status(url, email, NEW) == 200
    assert login_status(url, email, OLD) == 401
    assert other_device.get(f"{url}/api/v1/auth/me", timeout=10).status_code in (401, 403)  # signed out
    reused = requests.post(f"{url}/api/v1/auth/password-reset/confirm", json=confirm, timeout=10)
    assert reused.status_code == 400 and "token" in reused.json()["error"]["detail"]

    notice = smtp.wait_for(email, "Your Symphony password was changed")
    assert link_in(notice, url, "/forgot-password")
    # Nothing was sent to the address without an account, and one reset mail to the account.
    assert smtp.to("no-" + email) == []
    assert len([m for m in smtp.to(email) if "Reset" in m["Subject"]]) == 1


def test_an_invitation_is_mailed_and_its_link_opens_the_invitation(mail_stack):
    url, smtp = mail_stack.url, mail_stack.smtp
    owner_email = f"owner-{uuid.uuid4().hex[:8]}@example.com"
    invitee = f"bob-{uuid.uuid4().hex[:8]}@example.com"
    owner = signed_up(url, owner_email, OLD, "Difference Engines")

    created = owner.post(f"{url}/api/v1/invitations", json={"email": invitee, "role": "member"}, timeout=10)
    assert created.status_code == 201, created.text
    assert created.json()["emailed"] is True

    message = smtp.wait_for(invitee, "invited you to Difference Engines")
    assert message["Subject"] == f"{owner_email} invited you to Difference Engines on Symphony"
    link = link_in(message, url, "/invite/")
    assert link == f"{url}/invite/{created.json()['token']}"
    preview = requests.get(f"{url}/api/v1/auth/invitations/{link.rsplit('/', 1)[1]}", timeout=10)
    assert preview.status_code == 200 and preview.json()["tenant_name"] == "Difference Engines"

    # The invitee signs up through the mailed link and lands in the tenant.
    joined = requests.Session()
    token = joined.get(f"{url}/api/v1/auth/csrf", timeout=10).json()["csrftoken"]
    body = {"email": invitee, "password": NEW, "invite": link.rsplit("/", 1)[1]}
    signup = joined.post(f"{url}/api/v1/auth/signup", json=body, headers={"X-CSRFToken": token}, timeout=10)
    assert signup.status_code == 201, signup.text
    assert [t["name"] for t in signup.json()["tenants"]] == ["Difference Engines"]


def test_a_new_email_address_is_confirmed_through_the_link_mailed_to_it(mail_stack):
    url, smtp = mail_stack.url, mail_stack.smtp
    old = f"ada-{uuid.uuid4().hex[:8]}@example.com"
    new = f"lovelace-{uuid.uuid4().hex[:8]}@example.com"
    session = signed_up(url, old, OLD, "Analytical Engines")

    asked = session.post(f"{url}/api/v1/auth/email", json={"new_email": new, "current_password": OLD}, timeout=10)
    assert asked.status_code == 202, asked.text
    message = smtp.wait_for(new, "Confirm your new Symphony email address")
    token = link_in(message, url, "/confirm-email/").rsplit("/", 1)[1]
    assert login_status(url, old, OLD) == 200  # nothing changed yet

    confirmed = requests.post(f"{url}/api/v1/auth/email/confirm", json={"token": token}, timeout=10)
    assert confirmed.status_code == 200 and confirmed.json() == {"email": new}
    assert login_status(url, new, OLD) == 200 and login_status(url, old, OLD) == 401
    assert session.get(f"{url}/api/v1/auth/me", timeout=10).json()["user"]["email"] == new
    notice = smtp.wait_for(old, "Your Symphony account has a new email address")
    assert new in notice.get_body(preferencelist=("plain",)).get_content()
    again = requests.post(f"{url}/api/v1/auth/email/confirm", json={"token": token}, timeout=10)
    assert again.status_code == 400
