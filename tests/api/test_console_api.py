"""What the console's first minutes lean on: signing in with a username or an email, sign-up's
password validators, staff tenant actions, program-name validation, declared example arguments,
runs listed with their program's name, and the upload limit the browser checks."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from rest_framework.test import APIClient

from api.models import AuditLog, Membership, Plan, Program, Tenant
from api.services import programs
from api.services.runs import create_run

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_auth_throttle():
    """Sign-in and sign-up share the per-address ``auth`` throttle, whose Redis counters outlive
    a test: each test here starts with none spent."""
    from django.core.cache import cache

    cache.clear()


def _login(identifier: str, password: str):
    return APIClient().post("/api/v1/auth/login", {"email": identifier, "password": password}, format="json")


def test_the_admin_make_up_creates_signs_in_with_its_username_or_its_email(settings, tmp_path, monkeypatch):
    settings.VAR_DIR = tmp_path
    monkeypatch.setenv("SYMPHONY_ADMIN_PASSWORD", "admin-pass-123")
    call_command("create_demo")
    creds = (tmp_path / "admin-credentials.txt").read_text()
    assert creds.splitlines()[0] == "Sign in as: admin (or admin@localhost)", creds
    for identifier in ("admin", "admin@localhost", "ADMIN@localhost", " admin "):
        response = _login(identifier, "admin-pass-123")
        assert response.status_code == 200, (identifier, response.content)
        me = response.json()
        assert me["user"]["is_staff"] is True and me["active_tenant"] is None
    wrong = _login("admin", "not-the-password")
    assert wrong.status_code == 401
    assert wrong.json()["error"]["message"] == "wrong email, username or password"
    call_command("create_demo")  # the password is read back from the file, unchanged
    assert _login("admin", "admin-pass-123").status_code == 200


def test_console_users_still_sign_in_with_their_email_in_any_case(api_tenant_a):
    assert _login("ALPHA@example.com", "pw-12345678").status_code == 200
    assert _login("nobody@example.com", "pw-12345678").status_code == 401


@pytest.mark.parametrize(
    ("password", "says"),
    [("password", "too common"), ("12345678901", "entirely numeric"), ("short", "at least 8")],
)
def test_sign_up_applies_djangos_password_validators(password, says):
    body = {"email": "new@example.com", "password": password, "tenant_name": "New"}
    response = APIClient().post("/api/v1/auth/signup", body, format="json")
    assert response.status_code == 400, response.content
    messages = " ".join(response.json()["error"]["detail"]["password"])
    assert says in messages, messages
    assert not get_user_model().objects.filter(username="new@example.com").exists()


def _staff_client() -> APIClient:
    staff = get_user_model().objects.create_user(username="ops", email="ops@localhost", password="x", is_staff=True)
    client = APIClient()
    client.force_login(staff)
    return client


def test_staff_change_a_tenants_plan_and_close_it(api_tenant_a):
    Plan.objects.get_or_create(name="pro")
    client = _staff_client()
    tenant = api_tenant_a.tenant
    assert "pro" in client.get("/api/v1/admin/plans").json()["plans"]
    unknown = client.patch(f"/api/v1/admin/tenants/{tenant.pk}", {"plan": "gold"}, format="json")
    assert unknown.status_code == 400 and "no plan named 'gold'" in unknown.json()["error"]["detail"]["plan"][0]
    changed = client.patch(f"/api/v1/admin/tenants/{tenant.pk}", {"plan": "pro"}, format="json")
    assert changed.status_code == 200 and changed.json()["plan"] == "pro", changed.content
    assert AuditLog.objects.get(action="tenant.plan").detail == {"from": "free", "to": "pro"}

    wrong = client.post(f"/api/v1/admin/tenants/{tenant.pk}/close", {"confirm": "nope"}, format="json")
    assert wrong.status_code == 400 and "confirm" in wrong.json()["error"]["detail"]
    closed = client.post(f"/api/v1/admin/tenants/{tenant.pk}/close", {"confirm": tenant.slug}, format="json")
    assert closed.status_code == 200 and closed.json()["closed_at"], closed.content
    assert not Membership.objects.filter(tenant=tenant).exists()
    assert AuditLog.objects.get(action="tenant.close").detail["by_staff"] is True
    again = client.patch(f"/api/v1/admin/tenants/{tenant.pk}", {"plan": "pro"}, format="json")
    assert again.status_code == 409


def test_tenant_users_cannot_use_the_staff_tenant_actions(api_tenant_a, api_tenant_b):
    client = api_tenant_a.session_client()
    other = api_tenant_b.tenant
    assert client.patch(f"/api/v1/admin/tenants/{other.pk}", {"plan": "free"}, format="json").status_code == 403
    assert client.post(f"/api/v1/admin/tenants/{other.pk}/close", {"confirm": other.slug}).status_code == 403
    assert Tenant.objects.get(pk=other.pk).closed_at is None


SOURCE = b'"""Says hello.\n\nExample args: {"name": "Ada", "times": 2}\n"""\n\n\ndef main(args):\n    return args\n'


def _upload(client, name: str, source: bytes = SOURCE, **extra):
    upload = SimpleUploadedFile("p.py", source, content_type="text/x-python")
    return client.post("/api/v1/programs", {"name": name, "file": upload, **extra}, format="multipart")


@pytest.mark.parametrize("name", ["a/b", "../etc", "back\\slash", "tab\there", "nul\x00"])
def test_program_names_with_separators_or_control_characters_are_refused(api_tenant_a, name):
    response = _upload(api_tenant_a.key_client(), name)
    assert response.status_code == 400, response.content
    assert "name" in response.json()["error"]["detail"]
    assert not Program.objects.exists()


def test_a_declared_example_becomes_the_default_args_unless_some_are_given(api_tenant_a):
    client = api_tenant_a.key_client()
    created = _upload(client, "hello.v2_final-1")
    assert created.status_code == 201, created.content
    assert created.json()["default_args"] == {"name": "Ada", "times": 2}
    given = _upload(client, "other", default_args='{"name": "Grace"}')
    assert given.json()["default_args"] == {"name": "Grace"}
    assert programs.declared_example_args(b'"""Example args: [1]"""\ndef main(a): pass\n') is None
    assert programs.declared_example_args(b'"""Example args: {bad"""\ndef main(a): pass\n') is None
    assert programs.declared_example_args(b"def main(a): pass\n") is None


def test_runs_list_their_programs_name_and_the_quota_says_the_upload_limit(api_tenant_a, settings):
    client = api_tenant_a.key_client()
    program = Program.objects.create(tenant=api_tenant_a.tenant, name="story")
    programs.add_version(program, "p.py", b"def main(args):\n    return args\n")
    create_run(api_tenant_a.tenant, program, None, {}, {})
    (row,) = client.get("/api/v1/runs").json()["results"]
    assert (row["program"], row["program_name"], row["version"]) == (program.pk, "story", 1)
    assert client.get("/api/v1/quota").json()["max_program_bytes"] == settings.SYMPHONY_MAX_PROGRAM_BYTES
