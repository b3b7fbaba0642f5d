"""Closing a tenant, through the real URL conf, session auth, PostgreSQL and Redis: who may close
it, what stops at once (keys, invitations, runs, members), and the purge that deletes programs,
runs and keys once cancelled runs have recorded their usage, while usage and audit rows stay.

The whole path with a real worker, Celery and sandboxes (KV files deleted from the worker and
its store, another tenant untouched): tests/integration/test_tenant_closure_e2e.py."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from rest_framework.test import APIClient

from api.models import ApiKey, AuditLog, Invitation, KVFile, Membership, Program, Run, Tenant, UsageRecord
from api.services import billing, programs, tenant_closure
from api.services.cancellation import stop_requested
from api.services.members import NotAllowed
from api.services.runs import RunConflict, RunOutcome, create_run, finish_run, start_run

pytestmark = pytest.mark.django_db


def _member(tenant, email: str, role: str = "member") -> APIClient:
    user = get_user_model().objects.create_user(username=email, email=email, password="pw-12345678")
    Membership.objects.create(user=user, tenant=tenant, role=role)
    client = APIClient()
    client.force_login(user)
    return client


def _program(tenant) -> Program:
    program = Program.objects.create(tenant=tenant, name="p")
    programs.add_version(program, "p.py", b"def main(a):\n    return 1\n")
    return program


def _close(client: APIClient, tenant, confirm: str | None = None):
    return client.post(f"/api/v1/tenants/{tenant.pk}/close", {"confirm": confirm or tenant.slug}, format="json")


def _error(response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


def test_only_an_owner_in_the_console_closes_a_tenant_and_types_its_slug(api_tenant_a, api_tenant_b):
    tenant = api_tenant_a.tenant
    owner = api_tenant_a.session_client()
    assert _error(_close(_member(tenant, "m@example.com"), tenant)) == (403, "permission_denied")
    assert _error(_close(api_tenant_a.key_client(), tenant)) == (403, "permission_denied")  # even an owner's key
    assert _error(_close(api_tenant_b.session_client(), tenant)) == (404, "not_found")  # not theirs: not said
    wrong = _close(owner, tenant, confirm="Alpha")
    assert wrong.status_code == 400 and "alpha" in wrong.json()["error"]["detail"]["confirm"][0]
    assert _error(owner.post(f"/api/v1/tenants/{tenant.pk}/close", {}, format="json")) == (400, "invalid")
    tenant.refresh_from_db()
    assert tenant.closed_at is None and api_tenant_a.key_client().get("/api/v1/programs").status_code == 200

    closed = _close(owner, tenant)
    assert closed.status_code == 200, closed.content
    assert closed.json()["tenants"] == [] and closed.json()["active_tenant"] is None
    with pytest.raises(tenant_closure.TenantClosed):
        tenant_closure.close(api_tenant_a.user, tenant, tenant.slug)


def test_closing_stops_keys_invitations_runs_and_members_at_once(api_tenant_a, api_tenant_b):
    tenant = api_tenant_a.tenant
    owner = api_tenant_a.session_client()
    member = _member(tenant, "m@example.com")
    invitation = owner.post("/api/v1/invitations", {"email": "x@example.com"}, format="json").json()
    program = _program(tenant)
    create_run(tenant, program, None, {}, {})  # queued
    running, _ = create_run(tenant, program, None, {}, {})
    start_run(str(running.pk), "local")
    other_run, _ = create_run(api_tenant_b.tenant, _program(api_tenant_b.tenant), None, {}, {})

    assert _close(owner, tenant).status_code == 200

    assert _error(api_tenant_a.key_client().get("/api/v1/programs")) == (401, "authentication_failed")
    assert _error(APIClient().get(f"/api/v1/auth/invitations/{invitation['token']}")) == (404, "not_found")
    assert {r.status for r in Run.objects.filter(tenant=tenant)} == {"cancelled"}
    assert stop_requested(str(running.pk))  # its executor stops the program
    assert _error(member.get("/api/v1/programs")) == (403, "permission_denied")
    assert member.get("/api/v1/auth/me").json()["tenants"] == []
    assert not Membership.objects.filter(tenant=tenant).exists()
    audit = AuditLog.objects.get(tenant=tenant, action="tenant.close")
    assert audit.actor == api_tenant_a.user and audit.detail["active_runs"] == 2
    assert sorted(audit.detail["members_removed"]) == ["alpha@example.com", "m@example.com"]
    assert audit.detail["keys_revoked"] == 1 and audit.detail["invitations_revoked"] == 1

    # A run created in the moment the tenant closed never starts; no new one is accepted.
    late = Run.objects.create(tenant=tenant, program_version=program.versions.get())
    assert start_run(str(late.pk), "local") is None
    assert Run.objects.get(pk=late.pk).status == "cancelled"
    with pytest.raises(RunConflict, match="closed"):
        create_run(tenant, program, None, {}, {})

    # The other tenant goes on.
    assert Run.objects.get(pk=other_run.pk).status == "queued"
    assert api_tenant_b.key_client().get("/api/v1/programs").json()["count"] == 1


def test_purge_waits_for_cancelled_runs_then_deletes_data_but_keeps_billing(api_tenant_a, api_tenant_b):
    tenant = api_tenant_a.tenant
    program = _program(tenant)
    _program(api_tenant_b.tenant)
    done, _ = create_run(tenant, program, None, {}, {})
    start_run(str(done.pk), "local")
    finish_run(str(done.pk), RunOutcome(status="succeeded", result=1, usage={"decode_tokens": 5}))
    running, _ = create_run(tenant, program, None, {}, {})
    start_run(str(running.pk), "local")
    KVFile.objects.create(tenant=tenant, worker="local", name="notes", bytes=1 << 20, residency="disk")
    tenant_closure.close(api_tenant_a.user, tenant, tenant.slug)

    # The cancelled run's executor has not reported yet: its usage must not be lost.
    with pytest.raises(tenant_closure.PurgePending, match="1 run"):
        tenant_closure.purge(tenant.pk)
    assert billing.meter_kv_storage(now=1e12) == 0  # closing files are not billed meanwhile
    finish_run(str(running.pk), RunOutcome(status="failed", error="cancelled", usage={"decode_tokens": 3}))

    report = tenant_closure.purge(tenant.pk)
    assert report == tenant_closure.PurgeReport(programs=1, runs=2, api_keys=1, invitations=0)
    assert not Program.objects.filter(tenant=tenant).exists() and not Run.objects.filter(tenant=tenant).exists()
    assert not ApiKey.objects.filter(tenant=tenant).exists() and not Invitation.objects.filter(tenant=tenant).exists()
    usage = UsageRecord.objects.filter(tenant=tenant)
    assert sorted(u.decode_tokens for u in usage) == [3, 5] and {u.run_id for u in usage} == {None}
    lines = {line["item"]: line for line in billing.invoice(tenant, timezone.now().strftime("%Y-%m"))["lines"]}
    assert lines["decode_tokens"]["quantity"] == "8"  # what it consumed is still billed
    tenant.refresh_from_db()
    assert tenant.purged_at is not None and AuditLog.objects.filter(tenant=tenant, action="tenant.close").exists()
    assert tenant_closure.purge(tenant.pk) == tenant_closure.PurgeReport(0, 0, 0, 0)
    assert Program.objects.filter(tenant=api_tenant_b.tenant).count() == 1  # another tenant's stays


def test_a_cancelled_run_whose_executor_died_is_not_waited_for_past_its_deadline(api_tenant_a):
    tenant = api_tenant_a.tenant
    run, _ = create_run(tenant, _program(tenant), None, {}, {})
    start_run(str(run.pk), "local")
    tenant_closure.close(api_tenant_a.user, tenant, tenant.slug)
    long_ago = timezone.now() - timezone.timedelta(days=1)
    Run.objects.filter(pk=run.pk).update(started_at=long_ago)
    assert tenant_closure.purge(tenant.pk).runs == 1


def test_kv_purge_goes_to_every_worker_that_may_hold_the_files(api_tenant_a, worker_heartbeats, settings):
    settings.SYMPHONY_WORKER_NAME = "local"
    worker_heartbeats({"name": "gpu-1", "ok": True})
    KVFile.objects.create(tenant=api_tenant_a.tenant, worker="gpu-gone", name="notes", residency="disk")
    assert tenant_closure.kv_workers(api_tenant_a.tenant) == {"local", "gpu-1", "gpu-gone"}


def test_closed_tenants_are_listed_for_staff_and_left_out_of_the_tenant_count(api_tenant_a, admin_client):
    tenant = api_tenant_a.tenant
    tenant_closure.close(api_tenant_a.user, tenant, tenant.slug)
    listed = {t["slug"]: t for t in admin_client.get("/api/v1/admin/tenants").json()}
    assert listed["alpha"]["closed_at"] is not None and listed["alpha"]["purged_at"] is None
    assert not Tenant.objects.filter(closed_at__isnull=True, pk=tenant.pk).exists()


def test_staff_close_an_abusive_tenant_from_the_django_admin(api_tenant_a, api_tenant_b, admin_client, admin_user):
    tenant = api_tenant_a.tenant
    running, _ = create_run(tenant, _program(tenant), None, {}, {})
    start_run(str(running.pk), "local")
    response = admin_client.post(
        "/admin/api/tenant/", {"action": "close_tenants", "_selected_action": [tenant.pk]}, follow=True
    )
    assert response.status_code == 200
    shown = [str(m) for m in response.context["messages"]]
    assert shown == ["alpha: closed; 1 run(s) cancelled, 1 member(s) removed; its data is being deleted"]
    tenant.refresh_from_db()
    assert tenant.closed_at is not None and Run.objects.get(pk=running.pk).status == "cancelled"
    assert _error(api_tenant_a.key_client().get("/api/v1/programs")) == (401, "authentication_failed")
    audit = AuditLog.objects.get(tenant=tenant, action="tenant.close")
    assert audit.actor == admin_user and audit.detail["by_staff"] is True
    api_tenant_b.tenant.refresh_from_db()
    assert api_tenant_b.tenant.closed_at is None  # only the selected one

    # Only staff may close a tenant they do not own.
    with pytest.raises(NotAllowed):
        tenant_closure.close(api_tenant_b.user, api_tenant_b.tenant, "beta", by_staff=True)
