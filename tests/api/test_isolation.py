"""Tenant isolation matrix: every tenant-scoped route registered on the router is checked so that
tenant B can neither list nor read nor act on tenant A's objects."""

from __future__ import annotations

import pytest

from api.models import ApiKey, AuditLog, KVFile, Membership, Program
from api.services import members, programs
from api.services.runs import create_run
from api.urls import router

pytestmark = pytest.mark.django_db

#: Resources an API key cannot reach at all (they manage people and keys, not programs).
CONSOLE_ONLY = {"api-key", "member", "invitation", "audit-log"}


def test_every_router_resource_is_tenant_scoped(api_tenant_a, api_tenant_b, settings, tmp_path):
    settings.SYMPHONY_WORKER_ADMIN_SOCKET = str(tmp_path / "absent.sock")
    prog = Program.objects.create(tenant=api_tenant_a.tenant, name="secret")
    programs.add_version(prog, "p.py", b"def main(a):\n    return 1\n")
    run, _ = create_run(api_tenant_a.tenant, prog, None, {}, {})
    kv = KVFile.objects.create(tenant=api_tenant_a.tenant, worker="local", name="secret-kv", residency="disk")
    objects = {
        "kv-file": kv.pk,
        "program": prog.pk,
        "run": run.pk,
        "api-key": ApiKey.objects.filter(tenant=api_tenant_a.tenant).first().pk,
        "member": Membership.objects.get(tenant=api_tenant_a.tenant).pk,
        "invitation": members.invite(api_tenant_a.user, api_tenant_a.tenant, "x@example.com", "member").invitation.pk,
        "audit-log": AuditLog.objects.get(tenant=api_tenant_a.tenant).pk,
    }
    registered = {basename for _, _, basename in router.registry}
    assert registered == set(objects), "new tenant resource: add it to this matrix"
    for intruder in (api_tenant_b.key_client(), api_tenant_b.session_client()):
        for prefix, _, basename in router.registry:
            listing = intruder.get(f"/api/v1/{prefix}")
            if listing.status_code == 403:  # API keys never reach key or team management
                assert basename in CONSOLE_ONLY and intruder.__dict__.get("_credentials"), prefix
                continue
            ids = [str(item["id"]) for item in listing.json()["results"]]
            assert str(objects[basename]) not in ids, prefix
            for method, suffix in [
                ("get", ""),
                ("delete", ""),
                ("post", "/cancel"),
                ("get", "/versions"),
                ("post", "/pin"),
                ("get", "/logs"),
            ]:
                response = getattr(intruder, method)(f"/api/v1/{prefix}/{objects[basename]}{suffix}")
                assert response.status_code in (403, 404, 405), (prefix, method, suffix, response.status_code)
                if response.status_code == 404 and response["Content-Type"] == "application/json":
                    assert response.json()["error"]["code"] == "not_found", (prefix, suffix, response.json())
    assert Program.objects.filter(pk=prog.pk).exists() and KVFile.objects.filter(pk=kv.pk).exists()
    assert Membership.objects.filter(pk=objects["member"]).exists()
