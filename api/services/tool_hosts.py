"""A tenant's tool-host allowlist: the hosts its LIPs may reach with ``http_fetch``.

Owners set it (``PUT /tool-hosts``, the console's team page) within their plan's
``max_tool_hosts``; a run may narrow it with ``limits.allowed_hosts``, and a run naming a host
outside it is refused when it is created (accepting it and dropping the host would leave the
program a later EPERM that contradicts what its author listed). Entries are ``host`` (the
scheme's default port) or ``host:port``, compared case-insensitively as the worker does
(``gpu_worker/brokered_io.py``), in one canonical spelling (``gpu_worker/address_policy.py``).
Owners may not list an address that is not public, in any spelling (``2130706433``, ``127.1``,
``[::ffff:127.0.0.1]``), nor ``localhost``: the worker reaches internal addresses only when an
operator lists them literally (Django admin), never through a tenant's list.
"""

from __future__ import annotations

from django.db import transaction

from api.models import AuditLog, Tenant
from api.services import members
from api.services.host_entries import ToolHostsInvalid, normalize, spelling
from api.services.quotas import plan_limits


def set_hosts(actor, tenant: Tenant, hosts: list[str]) -> list[str]:
    """Replace the tenant's list (owners only; NotAllowed otherwise), deduplicated in the order
    given, at most the plan's ``max_tool_hosts``; audited."""
    if members.role_of(actor, tenant) != members.OWNER:
        raise members.NotAllowed("only an owner of this tenant can change its tool hosts")
    clean = list(dict.fromkeys(normalize(h) for h in hosts))
    cap = plan_limits(tenant).max_tool_hosts
    if len(clean) > cap:
        raise ToolHostsInvalid(f"{len(clean)} tool hosts: plan {tenant.plan} allows at most {cap} (max_tool_hosts)")
    with transaction.atomic():
        locked = Tenant.objects.select_for_update().get(pk=tenant.pk)
        before = list(locked.allowed_tool_hosts)
        locked.allowed_tool_hosts = clean
        locked.save(update_fields=["allowed_tool_hosts"])
        AuditLog.objects.create(
            actor=actor,
            tenant=locked,
            action="tool_hosts.set",
            target=tenant.slug,
            detail={"before": before, "after": clean},
        )
    tenant.allowed_tool_hosts = clean
    return clean


def check_run_hosts(tenant: Tenant, limits: dict) -> None:
    """Refuse a run whose ``limits.allowed_hosts`` name hosts outside the tenant's list."""
    requested = limits.get("allowed_hosts")
    if not requested:
        return
    allowed = {str(h).lower() for h in tenant.allowed_tool_hosts}
    outside = [h for h in dict.fromkeys(requested) if spelling(h) not in allowed]
    if outside:
        raise ToolHostsInvalid(
            "limits.allowed_hosts names hosts outside the tenant's tool hosts: "
            + ", ".join(outside)
            + " (an owner adds them with PUT /tool-hosts or on the console's team page)"
        )


def view(tenant: Tenant) -> dict:
    """``GET /tool-hosts``: the list and the plan's bound on it."""
    return {"hosts": list(tenant.allowed_tool_hosts), "max_hosts": plan_limits(tenant).max_tool_hosts}
