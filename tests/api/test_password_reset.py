"""Password reset, invitation mails and the password-changed notice (api/services/mail.py).

Through the real URL conf and PostgreSQL; the mail tasks' bodies run in-process against Django's
test outbox here (the whole path, HTTP -> Celery -> SMTP, is tests/integration/test_mail_e2e.py).
"""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model
from django.core import mail as outbox
from django.core.cache import cache
from rest_framework.test import APIClient

from api.models import Invitation
from api.services import mail
from api.services.auth_failures import totals

pytestmark = pytest.mark.django_db

OLD, NEW = "pw-old-horse-1", "pw-new-battery-2"


@pytest.fixture(autouse=True)
def _fresh_counters():
    """The auth throttle and the one-mail-a-minute guard are Redis counters that outlive a test."""
    cache.clear()


def _user(email: str = "ada@example.com", password: str = OLD):
    return get_user_model().objects.create_user(username=email, email=email, password=password)


def _reset_link(email: str) -> tuple[str, str]:
    """Send the reset mail for ``email``, return the link's (uid, token)."""
    assert mail.send_password_reset(email) == 1
    found = re.search(r"/reset-password/([^/\s]+)/(\S+)", outbox.outbox[-1].body)
    assert found, outbox.outbox[-1].body
    return found.group(1), found.group(2)


def _confirm(uid: str, token: str, password: str = NEW):
    body = {"uid": uid, "token": token, "new_password": password}
    return APIClient().post("/api/v1/auth/password-reset/confirm", body, format="json")


def _logs_in(email: str, password: str) -> bool:
    body = {"email": email, "password": password}
    return APIClient().post("/api/v1/auth/login", body, format="json").status_code == 200


def test_reset_request_answers_the_same_for_known_and_unknown_addresses():
    _user()
    client = APIClient()
    known = client.post("/api/v1/auth/password-reset", {"email": "Ada@Example.com"}, format="json")
    unknown = client.post("/api/v1/auth/password-reset", {"email": "nobody@example.com"}, format="json")
    assert known.status_code == unknown.status_code == 202
    assert known.json() == unknown.json()


def test_reset_request_validates_the_address():
    response = APIClient().post("/api/v1/auth/password-reset", {"email": "not-an-email"}, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid" and "email" in response.json()["error"]["detail"]


def test_reset_mail_links_to_the_console_and_only_active_accounts_get_one(settings):
    settings.SYMPHONY_PUBLIC_URL = "https://console.example.com"
    _user()
    get_user_model().objects.create_user(username="gone@example.com", email="gone@example.com", is_active=False)
    assert mail.send_password_reset("nobody@example.com") == 0
    assert mail.send_password_reset("gone@example.com") == 0
    assert outbox.outbox == []
    assert mail.send_password_reset("ADA@example.com") == 1  # addresses match case-insensitively
    message = outbox.outbox[0]
    assert message.to == ["ada@example.com"] and message.subject == "Reset your Symphony password"
    assert re.search(r"https://console\.example\.com/reset-password/\S+/\S+", message.body)
    assert "60 minutes" in message.body


def test_a_reset_link_sets_the_password_once_and_ends_other_sessions():
    user = _user()
    signed_in = APIClient()
    signed_in.force_login(user)
    assert signed_in.get("/api/v1/auth/me").json()["user"]["email"] == "ada@example.com"
    uid, token = _reset_link("ada@example.com")

    assert _confirm(uid, token).status_code == 204
    assert _logs_in("ada@example.com", NEW) and not _logs_in("ada@example.com", OLD)
    assert signed_in.get("/api/v1/auth/me").status_code == 401  # the old session ended
    again = _confirm(uid, token, "pw-third-staple-3")
    assert again.status_code == 400 and "token" in again.json()["error"]["detail"]
    assert _logs_in("ada@example.com", NEW)


def test_bad_reset_links_are_refused_and_counted():
    user = _user()
    uid, token = _reset_link("ada@example.com")
    before = totals()["bad_reset_link"]
    for bad_uid, bad_token in [
        (uid, token[:-1] + ("a" if token[-1] != "a" else "b")),  # tampered
        ("!!", token),  # not base64
        ("OTk5OTk5", token),  # "999999": no such user
        (uid, "x" * 128),
    ]:
        response = _confirm(bad_uid, bad_token)
        assert response.status_code == 400, (bad_uid, bad_token)
        assert response.json()["error"]["detail"]["token"] == [
            "this reset link is invalid, was already used or has expired: ask for a new one"
        ]
    assert totals()["bad_reset_link"] == before + 4
    user.refresh_from_db()
    assert user.check_password(OLD)


def test_an_expired_reset_link_is_refused(settings):
    _user()
    uid, token = _reset_link("ada@example.com")
    settings.PASSWORD_RESET_TIMEOUT = -1  # every token is past its time
    assert _confirm(uid, token).status_code == 400
    assert _logs_in("ada@example.com", OLD)


def test_the_new_password_must_pass_the_validators_and_the_link_survives_a_refusal():
    _user()
    uid, token = _reset_link("ada@example.com")
    for weak in ("12345678901", "password123", "ada@example.com"):
        response = _confirm(uid, token, weak)
        assert response.status_code == 400 and "new_password" in response.json()["error"]["detail"], weak
    short = _confirm(uid, token, "short")
    assert short.status_code == 400 and "new_password" in short.json()["error"]["detail"]
    assert _confirm(uid, token).status_code == 204


def test_reset_mails_to_one_address_are_limited_to_one_a_minute(monkeypatch):
    queued = []
    monkeypatch.setattr(mail, "_enqueue", lambda task, *args: queued.append((task.name, args)))
    for _ in range(3):
        mail.request_password_reset("Ada@example.com ")
    mail.request_password_reset("bob@example.com")
    assert queued == [
        ("api.send_password_reset_mail", ("ada@example.com",)),
        ("api.send_password_reset_mail", ("bob@example.com",)),
    ]


def test_a_broker_outage_is_a_clear_503_and_nothing_is_lost(monkeypatch):
    from kombu.exceptions import OperationalError

    from api.tasks import send_password_reset_mail

    def down(*args, **kwargs):
        raise OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    monkeypatch.setattr(send_password_reset_mail, "delay", down)
    response = APIClient().post("/api/v1/auth/password-reset", {"email": "ada@example.com"}, format="json")
    assert response.status_code == 503 and response.json()["error"]["code"] == "mail_unavailable"
    # Nothing went out, so asking again once the broker is back is not held to the one-a-minute rule.
    queued = []
    monkeypatch.setattr(send_password_reset_mail, "delay", lambda *args: queued.append(args))
    response = APIClient().post("/api/v1/auth/password-reset", {"email": "ada@example.com"}, format="json")
    assert response.status_code == 202 and queued == [("ada@example.com",)]


def test_password_changed_notice_goes_to_the_account_only_while_it_is_active():
    user = _user()
    assert mail.send_password_changed(user.pk)
    assert outbox.outbox[0].to == ["ada@example.com"]
    assert outbox.outbox[0].subject == "Your Symphony password was changed"
    assert "/forgot-password" in outbox.outbox[0].body
    user.is_active = False
    user.save()
    assert not mail.send_password_changed(user.pk)
    assert len(outbox.outbox) == 1


def test_invitation_mail_carries_the_link_unless_revoked_or_the_token_is_wrong(settings):
    settings.SYMPHONY_PUBLIC_URL = "https://console.example.com"
    owner = _user("owner@example.com")
    client = APIClient()
    client.force_login(owner)
    client.post("/api/v1/tenants", {"name": "Analytical & Engines"}, format="json")
    created = client.post("/api/v1/invitations", {"email": "Bob@example.com", "role": "member"}, format="json")
    assert created.status_code == 201, created.content
    body = created.json()
    assert body["emailed"] is True
    invitation = Invitation.objects.get(pk=body["id"])

    assert not mail.send_invitation(invitation.pk, "inv_wrong")
    assert mail.send_invitation(invitation.pk, body["token"])
    message = outbox.outbox[-1]
    assert message.to == ["bob@example.com"]
    assert message.subject == "owner@example.com invited you to Analytical & Engines on Symphony"  # not &amp;
    assert f"https://console.example.com/invite/{body['token']}" in message.body

    client.delete(f"/api/v1/invitations/{invitation.pk}")
    assert not mail.send_invitation(invitation.pk, body["token"])
    assert len(outbox.outbox) == 1


def test_changing_the_password_in_the_console_queues_the_notice(monkeypatch):
    queued = []
    monkeypatch.setattr(mail, "_enqueue", lambda task, *args: queued.append((task.name, args)))
    user = _user()
    client = APIClient()
    client.force_login(user)
    body = {"current_password": OLD, "new_password": NEW}
    assert client.post("/api/v1/auth/password", body, format="json").status_code == 204
    assert queued == [("api.send_password_changed_mail", (user.pk,))]


@pytest.mark.integration
def test_smtp_refusals_for_good_are_dropped_and_for_now_are_retried(settings, smtp_sink):
    """Against a real SMTP server: a 5xx refusal is logged and dropped (retrying cannot help), a
    4xx or an unreachable server raises an OSError, which the mail tasks retry (autoretry_for)."""
    import smtplib

    from api.tasks import send_password_changed_mail

    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = smtp_sink.host, smtp_sink.port
    user = _user()
    assert mail.send_password_changed(user.pk)
    assert smtp_sink.wait_for("ada@example.com", "password was changed")

    smtp_sink.refuse["ada@example.com"] = "550 5.1.1 no such mailbox"
    assert mail.send_password_changed(user.pk) is False
    smtp_sink.refuse["ada@example.com"] = "451 4.3.0 try again later"
    with pytest.raises(smtplib.SMTPRecipientsRefused):
        mail.send_password_changed(user.pk)
    settings.EMAIL_PORT = 1  # nothing listens there
    with pytest.raises(OSError):
        mail.send_password_changed(user.pk)
    assert issubclass(smtplib.SMTPRecipientsRefused, send_password_changed_mail.autoretry_for)
    assert len(smtp_sink.to("ada@example.com")) == 1


def test_staff_mail_a_reset_link_from_the_django_admin(monkeypatch, admin_client):
    queued = []
    monkeypatch.setattr(mail, "_enqueue", lambda task, *args: queued.append((task.name, args)))
    ada, gone = _user(), _user("gone@example.com")
    gone.is_active = False
    gone.save()
    body = {"action": "mail_password_reset", "_selected_action": [ada.pk, gone.pk]}
    response = admin_client.post("/admin/auth/user/", body, follow=True)
    assert response.status_code == 200
    shown = [str(m) for m in response.context["messages"]]
    assert shown == ["password-reset link queued for 1 user(s) (one per address a minute)"]
    assert queued == [("api.send_password_reset_mail", ("ada@example.com",))]


def test_the_reset_answer_says_how_long_the_link_lasts(settings):
    settings.PASSWORD_RESET_TIMEOUT = 1800
    response = APIClient().post("/api/v1/auth/password-reset", {"email": "ada@example.com"}, format="json")
    assert response.status_code == 202 and response.json()["valid_minutes"] == 30


def test_a_reset_may_keep_the_accounts_api_keys_and_the_choice_is_audited():
    from api.models import AuditLog
    from api.services import members
    from api.services.keys import issue_key, verify_key

    user = _user()
    tenant = members.create_tenant(user, "Engines")
    kept = issue_key(tenant, "ci", ["runs"], user).secret
    uid, token = _reset_link(user.email)
    body = {"uid": uid, "token": token, "new_password": NEW, "revoke_api_keys": False}
    response = APIClient().post("/api/v1/auth/password-reset/confirm", body, format="json")
    assert response.status_code == 204
    assert verify_key(kept) is not None
    assert AuditLog.objects.filter(tenant=tenant, action="api_key.kept_after_reset", actor=user).count() == 1
    assert not AuditLog.objects.filter(tenant=tenant, action="api_key.revoke").exists()


def test_a_completed_reset_lifts_the_accounts_sign_in_lock():
    from api.services import login_lockout

    user = _user()
    bad = {"email": user.email, "password": "not-it"}
    codes = [APIClient().post("/api/v1/auth/login", bad, format="json").status_code for _ in range(10)]
    assert codes[-1] == 429 and codes[:-1] == [401] * 9
    assert not _logs_in(user.email, OLD)  # locked: the right password too
    assert _confirm(*_reset_link(user.email)).status_code == 204
    assert _logs_in(user.email, NEW)
    assert login_lockout.lock_seconds(9) == 0 and login_lockout.lock_seconds(10) == 60  # the defaults
