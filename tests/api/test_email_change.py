"""Changing the email address an account signs in with (api/services/accounts.py).

Through the real URL conf, session auth and PostgreSQL; the confirmation mail's body runs
in-process against Django's test outbox (HTTP -> Celery -> SMTP is tests/integration/test_mail_e2e.py).
"""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model
from django.core import mail as outbox
from django.core import signing
from django.core.cache import cache
from rest_framework.test import APIClient

from api.services import accounts, mail
from api.services.keys import issue_key
from tests.conftest import at_once

pytestmark = pytest.mark.django_db

PASSWORD = "pw-old-horse-1"


@pytest.fixture(autouse=True)
def _fresh_counters():
    cache.clear()


@pytest.fixture
def queued(monkeypatch) -> list:
    """Mail tasks queued by the code under test, as (task name, args)."""
    calls: list = []
    monkeypatch.setattr(mail, "_enqueue", lambda task, *args: calls.append((task.name, args)))
    return calls


def _user(email: str = "ada@example.com"):
    return get_user_model().objects.create_user(username=email, email=email, password=PASSWORD)


def _session(user) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def _ask(client: APIClient, new_email: str, password: str = PASSWORD):
    return client.post("/api/v1/auth/email", {"new_email": new_email, "current_password": password}, format="json")


def _confirm(token: str):
    return APIClient().post("/api/v1/auth/email/confirm", {"token": token}, format="json")


def _token(queued: list) -> str:
    name, (_new_email, token) = queued[-1]
    assert name == "api.send_email_change_mail"
    return token


def test_the_address_changes_only_when_the_mailed_link_is_opened(queued, django_capture_on_commit_callbacks):
    user = _user()
    client = _session(user)
    asked = _ask(client, "Ada.Lovelace@Example.com")
    assert asked.status_code == 202, asked.content
    assert queued[0][1][0] == "ada.lovelace@example.com"
    user.refresh_from_db()
    assert user.email == "ada@example.com"  # not yet

    with django_capture_on_commit_callbacks(execute=True):
        confirmed = _confirm(_token(queued))
    assert confirmed.status_code == 200 and confirmed.json() == {"email": "ada.lovelace@example.com"}
    user.refresh_from_db()
    assert user.email == user.username == "ada.lovelace@example.com"
    assert queued[-1] == ("api.send_email_changed_mail", ("ada@example.com", "ada.lovelace@example.com"))
    login = APIClient().post
    ok = login("/api/v1/auth/login", {"email": "ada.lovelace@example.com", "password": PASSWORD}, format="json")
    old = login("/api/v1/auth/login", {"email": "ada@example.com", "password": PASSWORD}, format="json")
    assert ok.status_code == 200 and old.status_code == 401
    assert client.get("/api/v1/auth/me").json()["user"]["email"] == "ada.lovelace@example.com"  # still signed in


def test_a_link_works_once_and_a_later_change_voids_earlier_links(queued):
    user = _user()
    client = _session(user)
    _ask(client, "first@example.com")
    first = _token(queued)
    _ask(client, "second@example.com")
    second = _token(queued)
    assert _confirm(second).status_code == 200
    for spent in (second, first):  # the address they replace is gone
        response = _confirm(spent)
        assert response.status_code == 400 and "token" in response.json()["error"]["detail"]
    user.refresh_from_db()
    assert user.email == "second@example.com"


def test_refusals(queued):
    user = _user()
    _user("taken@example.com")
    client = _session(user)
    wrong = _ask(client, "new@example.com", "not-my-password")
    assert wrong.status_code == 400 and "current_password" in wrong.json()["error"]["detail"]
    taken = _ask(client, "Taken@example.com")
    assert taken.status_code == 409 and taken.json()["error"]["code"] == "exists"
    same = _ask(client, "ADA@example.com")
    assert same.status_code == 409
    bad = _ask(client, "not-an-email")
    assert bad.status_code == 400 and "new_email" in bad.json()["error"]["detail"]
    assert queued == []
    issued = issue_key(_tenant_of(user), "k", ["programs", "runs", "kv", "usage"], created_by=user)
    by_key = APIClient()
    by_key.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.secret}")
    assert _ask(by_key, "new@example.com").status_code == 403
    assert APIClient().post("/api/v1/auth/email", {"new_email": "x@example.com"}, format="json").status_code in (
        401,
        403,
    )


def _tenant_of(user):
    from api.services.members import create_tenant

    return create_tenant(user, "Analytical Engines")


def test_tampered_expired_and_foreign_links_are_refused(queued, monkeypatch):
    user = _user()
    _ask(_session(user), "new@example.com")
    token = _token(queued)
    forged = signing.dumps({"user": user.pk, "old": "ada@example.com", "new": "evil@example.com"}, salt="other")
    for bad in (token[:-2] + "xx", forged, "garbage", ""):
        response = _confirm(bad)
        assert response.status_code == 400, bad
    monkeypatch.setattr(accounts, "EMAIL_CHANGE_MAX_AGE_S", -1)
    assert _confirm(token).status_code == 400
    user.refresh_from_db()
    assert user.email == "ada@example.com"


def test_an_address_taken_after_the_request_is_not_stolen(queued):
    user = _user()
    _ask(_session(user), "new@example.com")
    token = _token(queued)
    _user("new@example.com")  # someone signed up with it meanwhile
    response = _confirm(token)
    assert response.status_code == 409 and response.json()["error"]["code"] == "exists"
    user.refresh_from_db()
    assert user.email == "ada@example.com"


@pytest.mark.django_db(transaction=True)
def test_two_clicks_of_one_link_change_the_address_once(queued):
    user = _user()
    _ask(_session(user), "new@example.com")
    token = _token(queued)
    results = at_once([lambda: _confirm(token).status_code] * 2)
    assert sorted(results) == [200, 400]
    assert [q for q in queued if q[0] == "api.send_email_changed_mail"] == [
        ("api.send_email_changed_mail", ("ada@example.com", "new@example.com"))
    ]


def test_the_mails_say_what_happens():
    assert mail.send_email_change("new@example.com", "tok:en")
    assert outbox.outbox[0].to == ["new@example.com"]
    assert outbox.outbox[0].subject == "Confirm your new Symphony email address"
    assert re.search(r"/confirm-email/tok:en\b", outbox.outbox[0].body)
    assert mail.send_email_changed("old@example.com", "new@example.com")
    assert outbox.outbox[1].to == ["old@example.com"] and "new@example.com" in outbox.outbox[1].body
