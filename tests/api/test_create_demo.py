"""``create_demo`` makes the demo tenant and a working API key file, idempotently."""

from __future__ import annotations

import stat

import pytest
from django.core.management import call_command

from api.models import Tenant
from api.services.keys import verify_key


@pytest.mark.django_db
def test_create_demo_tenant_and_key(settings, tmp_path, monkeypatch):
    settings.VAR_DIR = tmp_path
    monkeypatch.setenv("SYMPHONY_ADMIN_PASSWORD", "admin-pass-123")
    call_command("create_demo")
    key_file = tmp_path / "demo-api-key.txt"
    secret = key_file.read_text().strip()
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert verify_key(secret).tenant.slug == "demo"
    call_command("create_demo")
    assert key_file.read_text().strip() == secret
    assert Tenant.objects.filter(slug="demo").count() == 1
