"""Tenant owners manage their tool-host allowlist within the plan's bound; a run naming a host
outside it is refused with a 400 that names the host (never dropped silently)."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from api.models import AuditLog, Membership, Plan, Program
from api.services import programs
from api.services.quotas import session_limits

pytestmark = pytest.mark.django_db


@pytest.fixture
def program(api_tenant_a):
    prog = Program.objects.create(tenant=api_tenant_a.tenant, name="p")
    programs.add_version(prog, "p.py", b"def main(args):\n    return args\n")
    return prog


def test_an_owner_sets_the_list_everyone_reads_it_and_it_is_audited(api_tenant_a):
    owner = api_tenant_a.session_client()
    put = owner.put(
        "/api/v1/tool-hosts", {"hosts": ["API.Example.com", "tools.example.org:8443", "api.example.com"]}, format="json"
    )
    assert put.status_code == 200, put.content
    assert put.json() == {"hosts": ["api.example.com", "tools.example.org:8443"], "max_hosts": 8}
    assert api_tenant_a.key_client().get("/api/v1/tool-hosts").json()["hosts"] == [
        "api.example.com",
        "tools.example.org:8443",
    ]
    assert api_tenant_a.key_client().get("/api/v1/quota").json()["limits"]["max_tool_hosts"] == 8
    entry = AuditLog.objects.get(action="tool_hosts.set")
    assert entry.detail == {"before": [], "after": ["api.example.com", "tools.example.org:8443"]}


def test_members_and_api_keys_cannot_change_it(api_tenant_a):
    user = get_user_model().objects.create_user(username="m@example.com", email="m@example.com", password="pw-12345678")
    Membership.objects.create(user=user, tenant=api_tenant_a.tenant, role="member")
    member = api_tenant_a.session_client()
    member.force_authenticate(user)
    refused = member.put("/api/v1/tool-hosts", {"hosts": ["a.example"]}, format="json")
    assert refused.status_code == 403 and "only an owner" in refused.json()["error"]["message"]
    by_key = api_tenant_a.key_client().put("/api/v1/tool-hosts", {"hosts": ["a.example"]}, format="json")
    assert by_key.status_code == 403
    api_tenant_a.tenant.refresh_from_db()
    assert api_tenant_a.tenant.allowed_tool_hosts == []


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ("https://a.example/x", "not host or host:port"),
        ("*.example.com", "not host or host:port"),
        ("a.example:0", "port must be a number"),
        ("a.example:http", "port must be a number"),
        ("127.0.0.1:6379", "internal address"),
        ("10.0.0.5", "internal address"),
        ("169.254.169.254", "internal address"),
    ],
)
def test_entries_that_are_not_a_public_host_are_a_400_naming_them(api_tenant_a, entry, says):
    response = api_tenant_a.session_client().put("/api/v1/tool-hosts", {"hosts": [entry]}, format="json")
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid"
    message = response.json()["error"]["message"]
    assert says in message and entry in message


def test_the_plan_bounds_the_list(api_tenant_a):
    owner = api_tenant_a.session_client()
    hosts = [f"h{i}.example" for i in range(9)]
    response = owner.put("/api/v1/tool-hosts", {"hosts": hosts}, format="json")
    assert response.status_code == 400 and "at most 8 (max_tool_hosts)" in response.json()["error"]["message"]
    Plan.objects.filter(name="free").update(max_tool_hosts=9)
    assert owner.put("/api/v1/tool-hosts", {"hosts": hosts}, format="json").json()["max_hosts"] == 9


def test_a_run_naming_hosts_outside_the_list_is_a_400_naming_them(api_tenant_a, program):
    api_tenant_a.session_client().put("/api/v1/tool-hosts", {"hosts": ["api.example.com"]}, format="json")
    client = api_tenant_a.key_client()
    body = {"program": program.pk, "limits": {"allowed_hosts": ["api.example.com", "evil.example", "x.example:81"]}}
    refused = client.post("/api/v1/runs", body, format="json")
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid"
    message = refused.json()["error"]["message"]
    assert "evil.example, x.example:81" in message and "api.example.com," not in message
    ok = client.post(
        "/api/v1/runs", {"program": program.pk, "limits": {"allowed_hosts": ["API.example.com"]}}, format="json"
    )
    assert ok.status_code == 201, ok.content
    from api.models import Run

    assert session_limits(Run.objects.get(pk=ok.json()["id"]))["allowed_hosts"] == ["api.example.com"]


def test_a_run_may_name_a_listed_host_in_another_spelling(api_tenant_a, program):
    """The list is stored canonical (``134744072`` is kept as ``8.8.8.8``); a run naming the same
    host in another spelling narrows to it instead of being refused."""
    from api.models import Run

    owner = api_tenant_a.session_client()
    stored = owner.put("/api/v1/tool-hosts", {"hosts": ["134744072", "bücher.example"]}, format="json").json()
    assert stored["hosts"] == ["8.8.8.8", "xn--bcher-kva.example"], stored
    body = {"program": program.pk, "limits": {"allowed_hosts": ["0x08080808", "BÜCHER.example."]}}
    ok = api_tenant_a.key_client().post("/api/v1/runs", body, format="json")
    assert ok.status_code == 201, ok.content
    assert session_limits(Run.objects.get(pk=ok.json()["id"]))["allowed_hosts"] == ["8.8.8.8", "xn--bcher-kva.example"]
