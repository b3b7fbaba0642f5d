"""Teams: members and roles, invitations (link, signup, accept), leaving, new tenants, password.

Through the real URL conf, session auth and PostgreSQL; each rule is checked where it can be
broken (a member trying an owner's change, the last owner stepping down, a leaked link used by
someone else, an API key reaching for account routes)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.utils import timezone
from rest_framework.test import APIClient

from api.models import ApiKey, AuditLog, Invitation, Membership
from api.services.keys import issue_key, verify_key

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_throttle_counters():
    """Sign-in, invitation and password routes share the ``auth`` throttle (Redis counters that
    outlive a test); each test starts with none spent."""
    cache.clear()


def _user(email: str, password: str = "pw-12345678"):
    return get_user_model().objects.create_user(username=email, email=email, password=password)


def _session(user) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def _invite(owner_client: APIClient, email: str, role: str = "member") -> dict:
    response = owner_client.post("/api/v1/invitations", {"email": email, "role": role}, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def _error(response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


def test_invite_accept_and_member_list(api_tenant_a):
    owner = api_tenant_a.session_client()
    invitation = _invite(owner, "Bob@Example.com")
    assert invitation["email"] == "bob@example.com" and invitation["token"].startswith("inv_")
    stored = Invitation.objects.get(pk=invitation["id"])
    assert invitation["token"] not in stored.token_hash  # only a digest is kept
    assert [i["id"] for i in owner.get("/api/v1/invitations").json()["results"]] == [invitation["id"]]
    assert "token" not in owner.get("/api/v1/invitations").json()["results"][0]

    preview = APIClient().get(f"/api/v1/auth/invitations/{invitation['token']}")
    assert preview.status_code == 200
    assert preview.json() == {
        "tenant_name": "Alpha",
        "email": "bob@example.com",
        "role": "member",
        "invited_by": "alpha@example.com",
        "expires_at": invitation["expires_at"],
    }

    bob = _session(_user("bob@example.com"))
    me = bob.post(f"/api/v1/auth/invitations/{invitation['token']}/accept")
    assert me.status_code == 200, me.content
    assert me.json()["active_tenant"] == api_tenant_a.tenant.pk
    assert {"id": api_tenant_a.tenant.pk, "name": "Alpha", "slug": "alpha", "role": "member"} in me.json()["tenants"]
    # Bob now sees the tenant's resources; the link is spent.
    assert bob.get("/api/v1/programs").status_code == 200
    assert _error(bob.post(f"/api/v1/auth/invitations/{invitation['token']}/accept")) == (404, "not_found")
    assert owner.get("/api/v1/invitations").json()["results"] == []
    listed = owner.get("/api/v1/members").json()["results"]
    assert [(m["email"], m["role"]) for m in listed] == [("alpha@example.com", "owner"), ("bob@example.com", "member")]
    assert AuditLog.objects.filter(tenant=api_tenant_a.tenant, action="invitation.accept").count() == 1


def test_an_invitation_is_only_for_its_email_and_only_while_valid(api_tenant_a):
    owner = api_tenant_a.session_client()
    token = _invite(owner, "bob@example.com")["token"]
    mallory = _session(_user("mallory@example.com"))
    assert _error(mallory.post(f"/api/v1/auth/invitations/{token}/accept")) == (403, "permission_denied")
    assert not Membership.objects.filter(user__username="mallory@example.com", tenant=api_tenant_a.tenant).exists()

    Invitation.objects.filter(email="bob@example.com").update(expires_at=timezone.now() - timedelta(seconds=1))
    assert _error(APIClient().get(f"/api/v1/auth/invitations/{token}")) == (404, "not_found")
    bob = _session(_user("bob@example.com"))
    assert _error(bob.post(f"/api/v1/auth/invitations/{token}/accept")) == (404, "not_found")

    for junk in ("inv_" + "x" * 43, "sk_abc_def", "inv_" + "y" * 200):
        assert _error(APIClient().get(f"/api/v1/auth/invitations/{junk}")) == (404, "not_found")


def test_reinviting_replaces_the_pending_link_and_revoke_kills_it(api_tenant_a):
    owner = api_tenant_a.session_client()
    first = _invite(owner, "bob@example.com")
    second = _invite(owner, "bob@example.com", role="owner")
    assert APIClient().get(f"/api/v1/auth/invitations/{first['token']}").status_code == 404
    assert APIClient().get(f"/api/v1/auth/invitations/{second['token']}").json()["role"] == "owner"
    assert owner.delete(f"/api/v1/invitations/{second['id']}").status_code == 204
    assert APIClient().get(f"/api/v1/auth/invitations/{second['token']}").status_code == 404
    # Inviting someone who is already a member is a conflict, not a second membership.
    assert _error(owner.post("/api/v1/invitations", {"email": "alpha@example.com"}, format="json")) == (409, "conflict")


def test_signup_through_an_invitation_joins_instead_of_creating_a_tenant(api_tenant_a):
    token = _invite(api_tenant_a.session_client(), "carol@example.com", role="owner")["token"]
    client = APIClient()
    wrong = client.post(
        "/api/v1/auth/signup", {"email": "eve@example.com", "password": "long-pass-123", "invite": token}, format="json"
    )
    assert wrong.status_code == 400 and "email" in wrong.json()["error"]["detail"]
    assert not get_user_model().objects.filter(username="eve@example.com").exists()
    bad = client.post(
        "/api/v1/auth/signup",
        {"email": "carol@example.com", "password": "long-pass-123", "invite": "inv_nope"},
        format="json",
    )
    assert bad.status_code == 400 and "invite" in bad.json()["error"]["detail"]
    assert _error(
        client.post("/api/v1/auth/signup", {"email": "carol@example.com", "password": "long-pass-123"}, format="json")
    ) == (400, "invalid")

    response = client.post(
        "/api/v1/auth/signup",
        {"email": "Carol@example.com", "password": "long-pass-123", "invite": token},
        format="json",
    )
    assert response.status_code == 201, response.content
    assert response.json()["tenants"] == [
        {"id": api_tenant_a.tenant.pk, "name": "Alpha", "slug": "alpha", "role": "owner"}
    ]
    assert client.get("/api/v1/members").json()["count"] == 2


def test_only_owners_manage_the_team(api_tenant_a):
    owner = api_tenant_a.session_client()
    bob_user = _user("bob@example.com")
    bob_member = Membership.objects.create(user=bob_user, tenant=api_tenant_a.tenant, role="member")
    owner_member = Membership.objects.get(user=api_tenant_a.user, tenant=api_tenant_a.tenant)
    bob = _session(bob_user)

    assert bob.get("/api/v1/members").json()["count"] == 2  # members see the team
    assert _error(bob.post("/api/v1/invitations", {"email": "x@example.com"}, format="json")) == (
        403,
        "permission_denied",
    )
    assert _error(bob.patch(f"/api/v1/members/{bob_member.pk}", {"role": "owner"}, format="json")) == (
        403,
        "permission_denied",
    )
    assert _error(bob.delete(f"/api/v1/members/{owner_member.pk}")) == (403, "permission_denied")
    assert Membership.objects.get(pk=bob_member.pk).role == "member"

    response = owner.patch(f"/api/v1/members/{bob_member.pk}", {"role": "owner"}, format="json")
    assert response.status_code == 200 and response.json()["role"] == "owner"
    assert _error(owner.patch(f"/api/v1/members/{bob_member.pk}", {"role": "admin"}, format="json")) == (400, "invalid")
    assert AuditLog.objects.filter(action="member.role", target="bob@example.com").exists()


def test_the_last_owner_cannot_step_down_or_leave(api_tenant_a):
    owner = api_tenant_a.session_client()
    own = Membership.objects.get(user=api_tenant_a.user, tenant=api_tenant_a.tenant)
    assert _error(owner.patch(f"/api/v1/members/{own.pk}", {"role": "member"}, format="json")) == (409, "conflict")
    assert _error(owner.delete(f"/api/v1/members/{own.pk}")) == (409, "conflict")
    bob = Membership.objects.create(user=_user("bob@example.com"), tenant=api_tenant_a.tenant, role="owner")
    assert owner.patch(f"/api/v1/members/{own.pk}", {"role": "member"}, format="json").status_code == 200
    assert _error(_session(bob.user).patch(f"/api/v1/members/{bob.pk}", {"role": "member"}, format="json")) == (
        409,
        "conflict",
    )


def test_removal_revokes_the_members_keys_and_leaving_works(api_tenant_a):
    owner = api_tenant_a.session_client()
    bob_user = _user("bob@example.com")
    bob_member = Membership.objects.create(user=bob_user, tenant=api_tenant_a.tenant)
    bob_key = issue_key(api_tenant_a.tenant, "bob's", ["runs"], bob_user)
    assert verify_key(bob_key.secret) is not None

    assert owner.delete(f"/api/v1/members/{bob_member.pk}").status_code == 204
    assert verify_key(bob_key.secret) is None
    assert verify_key(api_tenant_a.key_secret) is not None  # the owner's own key is untouched
    bob = _session(bob_user)
    assert _error(bob.get("/api/v1/programs")) == (403, "permission_denied")
    me = bob.get("/api/v1/auth/me")
    assert me.status_code == 200 and me.json()["tenants"] == [] and me.json()["active_tenant"] is None

    carol = Membership.objects.create(user=_user("carol@example.com"), tenant=api_tenant_a.tenant)
    assert _session(carol.user).delete(f"/api/v1/members/{carol.pk}").status_code == 204
    assert AuditLog.objects.filter(action="member.leave", target="carol@example.com").exists()
    assert AuditLog.objects.get(action="member.remove").detail["keys_revoked"] == 1


def test_a_stranded_user_creates_a_tenant_and_the_number_owned_is_bounded(api_tenant_a, settings):
    dave = _session(_user("dave@example.com"))
    response = dave.post("/api/v1/tenants", {"name": "Dave's Lab"}, format="json")
    assert response.status_code == 201, response.content
    me = response.json()
    assert [t["role"] for t in me["tenants"]] == ["owner"] and me["active_tenant"] == me["tenants"][0]["id"]
    assert dave.get("/api/v1/quota").status_code == 200

    settings.SYMPHONY_MAX_OWNED_TENANTS = 2
    assert dave.post("/api/v1/tenants", {"name": "Second"}, format="json").status_code == 201
    assert _error(dave.post("/api/v1/tenants", {"name": "Third"}, format="json")) == (429, "quota_exceeded")
    assert _error(dave.post("/api/v1/tenants", {"name": ""}, format="json")) == (400, "invalid")


def test_api_keys_cannot_reach_team_or_account_routes(api_tenant_a):
    key = api_tenant_a.key_client()
    other = Membership.objects.get(user=api_tenant_a.user)
    for method, path, body in [
        ("get", "/api/v1/members", None),
        ("delete", f"/api/v1/members/{other.pk}", None),
        ("get", "/api/v1/invitations", None),
        ("post", "/api/v1/invitations", {"email": "x@example.com"}),
        ("post", "/api/v1/tenants", {"name": "via key"}),
        ("post", "/api/v1/auth/password", {"current_password": "pw-12345678", "new_password": "new-pass-123"}),
        ("post", "/api/v1/auth/switch-tenant", {"tenant": api_tenant_a.tenant.pk}),
    ]:
        response = getattr(key, method)(path, body, format="json")
        assert _error(response) == (403, "permission_denied"), (method, path, response.content)
    assert Membership.objects.filter(pk=other.pk).exists()
    assert api_tenant_a.user.check_password("pw-12345678")


def test_another_tenants_members_and_invitations_are_404(api_tenant_a, api_tenant_b):
    b_member = Membership.objects.get(tenant=api_tenant_b.tenant)
    b_invite = _invite(api_tenant_b.session_client(), "x@example.com")
    owner_a = api_tenant_a.session_client()
    assert _error(owner_a.get(f"/api/v1/members/{b_member.pk}")) == (404, "not_found")
    assert _error(owner_a.patch(f"/api/v1/members/{b_member.pk}", {"role": "member"}, format="json")) == (
        404,
        "not_found",
    )
    assert _error(owner_a.delete(f"/api/v1/members/{b_member.pk}")) == (404, "not_found")
    assert _error(owner_a.delete(f"/api/v1/invitations/{b_invite['id']}")) == (404, "not_found")
    assert APIClient().get(f"/api/v1/auth/invitations/{b_invite['token']}").status_code == 200


def test_password_change_keeps_this_session_and_needs_the_current_password(api_tenant_a):
    client = APIClient()
    client.post("/api/v1/auth/login", {"email": "alpha@example.com", "password": "pw-12345678"}, format="json")
    other = APIClient()
    other.post("/api/v1/auth/login", {"email": "alpha@example.com", "password": "pw-12345678"}, format="json")
    assert other.get("/api/v1/programs").status_code == 200

    wrong = client.post(
        "/api/v1/auth/password", {"current_password": "nope", "new_password": "new-pass-123"}, format="json"
    )
    assert wrong.status_code == 400 and "current_password" in wrong.json()["error"]["detail"]
    short = client.post(
        "/api/v1/auth/password", {"current_password": "pw-12345678", "new_password": "short"}, format="json"
    )
    assert short.status_code == 400 and "new_password" in short.json()["error"]["detail"]
    ok = client.post(
        "/api/v1/auth/password", {"current_password": "pw-12345678", "new_password": "new-pass-123"}, format="json"
    )
    assert ok.status_code == 204
    assert client.get("/api/v1/programs").status_code == 200  # this session stays signed in
    assert other.get("/api/v1/programs").status_code in (401, 403)  # the other one ended
    assert (
        APIClient()
        .post("/api/v1/auth/login", {"email": "alpha@example.com", "password": "new-pass-123"}, format="json")
        .status_code
        == 200
    )
    assert ApiKey.objects.filter(tenant=api_tenant_a.tenant, revoked_at__isnull=True).count() == 1


@pytest.mark.django_db(transaction=True)
def test_two_owners_demoting_each_other_at_once_leave_one_owner(api_tenant_a):
    """Each check sees the other still an owner unless team changes are serialised; with the
    tenant row locked exactly one demotion wins, and the loser, no longer an owner, is refused."""
    from concurrent.futures import ThreadPoolExecutor

    from django.db import connection

    from api.services import members

    first = Membership.objects.get(user=api_tenant_a.user)
    second = Membership.objects.create(user=_user("bob@example.com"), tenant=api_tenant_a.tenant, role="owner")
    barrier = threading.Barrier(2)

    def demote(actor, target) -> str:
        try:
            barrier.wait(timeout=10)
            members.change_role(actor, target, "member")
            return "ok"
        except (members.MembershipConflict, members.NotAllowed):
            return "refused"
        finally:
            connection.close()

    for _ in range(5):
        Membership.objects.filter(pk__in=[first.pk, second.pk]).update(role="owner")
        with ThreadPoolExecutor(2) as pool:
            outcomes = sorted(pool.map(lambda pair: demote(*pair), [(first.user, second), (second.user, first)]))
        assert outcomes == ["ok", "refused"]
        assert Membership.objects.filter(tenant=api_tenant_a.tenant, role="owner").count() == 1


def test_owners_read_their_tenants_audit_log_and_no_one_elses(api_tenant_a, api_tenant_b):
    owner = api_tenant_a.session_client()
    bob = Membership.objects.create(user=_user("bob@example.com"), tenant=api_tenant_a.tenant)
    _invite(owner, "carol@example.com")
    owner.patch(f"/api/v1/members/{bob.pk}", {"role": "owner"}, format="json")
    _invite(api_tenant_b.session_client(), "other@example.com")

    entries = owner.get("/api/v1/audit-log").json()["results"]
    assert [(e["action"], e["target"], e["actor"]) for e in entries] == [
        ("member.role", "bob@example.com", "alpha@example.com"),
        ("invitation.create", "carol@example.com", "alpha@example.com"),
    ]
    assert entries[0]["detail"] == {"old": "member", "new": "owner"}
    Membership.objects.filter(pk=bob.pk).update(role="member")
    assert _error(_session(bob.user).get("/api/v1/audit-log")) == (403, "permission_denied")
    assert _error(api_tenant_a.key_client().get("/api/v1/audit-log"))[0] == 403


def test_a_tenant_whose_slug_was_taken_meanwhile_gets_a_suffix_not_an_error(api_tenant_a, monkeypatch):
    """The slug is chosen before the insert: a concurrent sign-up with the same name can take it
    in between (simulated by handing out a taken slug)."""
    from api.services import members

    monkeypatch.setattr(members, "_unique_slug", lambda name: "alpha")
    tenant = members.create_tenant(_user("erin@example.com"), "Alpha")
    assert tenant.slug.startswith("alpha-") and tenant.slug != "alpha"


def test_every_tenant_a_person_creates_counts_against_their_one_account(api_tenant_a):
    """Bounds on shared pools apply per account (gpu_worker/resource_model.py): the tenants one
    user creates share one account key, a tenant of another user has its own."""
    from api.services import members

    erin = _user("erin@example.com")
    first, second = members.create_tenant(erin, "One"), members.create_tenant(erin, "Two")
    assert first.account_id == second.account_id == erin.id
    assert first.account_key == second.account_key == f"u{erin.id}"
    other = members.create_tenant(_user("frank@example.com"), "Three")
    assert other.account_key != first.account_key
    assert api_tenant_a.tenant.account_key == f"t{api_tenant_a.tenant.pk}"  # made by a script


def test_an_invitation_link_survives_a_secret_key_rotation_through_the_fallbacks(api_tenant_a, settings):
    owner = api_tenant_a.session_client()
    token = owner.post("/api/v1/invitations", {"email": "rot@example.com"}, format="json").json()["token"]
    old_key = settings.SECRET_KEY
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = "rotated-" + old_key, [old_key]
    assert APIClient().get(f"/api/v1/auth/invitations/{token}").status_code == 200
    settings.SECRET_KEY_FALLBACKS = []
    assert _error(APIClient().get(f"/api/v1/auth/invitations/{token}"))[0] == 404
