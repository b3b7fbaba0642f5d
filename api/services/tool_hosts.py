"""A tenant's tool-host allowlist: the hosts its LIPs may reach with ``http_fetch``.

Owners set it (``PUT /tool-hosts``, the console's team page) within their plan's
``max_tool_hosts``; a run may narrow it with ``limits.allowed_hosts``, and a run naming a host
outside it is refused when it is created (it used to be accepted and the host silently dropped,
so the program's later EPERM contradicted what its author had listed). Entries are ``host`` (the
scheme's default port) or ``host:port``, compared case-insensitively as the worker does
(``gpu_worker/brokered_io.py``). Owners may not list IP addresses of loopback, private,
link-local or reserved networks: the worker reaches those only when listed literally, and they
are the operator's (Django admin), not a tenant's.
"""

from __future__ import annotations

import ipaddress
import re

from django.db import transaction

from api.models import AuditLog, Tenant
from api.services import members
from api.services.quotas import plan_limits

#: A DNS name (labels of letters, digits and inner hyphens) or a dotted IPv4 address.
_HOST = re.compile(r"^(?=.{1,253}$)[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$")


class ToolHostsInvalid(ValueError):
    """An entry that is not ``host[:port]``, too many entries, or a run's hosts outside the
    tenant's list: HTTP 400 ``invalid``, the message naming them."""


def normalize(entry: str) -> str:
    """``entry`` lower-cased, or ToolHostsInvalid saying what is wrong with it."""
    text = str(entry).strip().lower()
    if "/" in text or "*" in text:
        raise ToolHostsInvalid(f"{entry!r} is not host or host:port (no scheme, path or wildcard)")
    host, sep, port = text.rpartition(":") if ":" in text else (text, "", "")
    if sep and not (port.isdigit() and 1 <= int(port) <= 65535):
        raise ToolHostsInvalid(f"{entry!r}: the port must be a number from 1 to 65535")
    if not _HOST.match(host):
        raise ToolHostsInvalid(f"{entry!r} is not host or host:port (no scheme, path or wildcard)")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return text
    if not address.is_global:
        raise ToolHostsInvalid(f"{entry!r} is an internal address: only an operator may allow those")
    return text


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
    outside = [h for h in dict.fromkeys(requested) if str(h).strip().lower() not in allowed]
    if outside:
        raise ToolHostsInvalid(
            "limits.allowed_hosts names hosts outside the tenant's tool hosts: "
            + ", ".join(outside)
            + " (an owner adds them with PUT /tool-hosts or on the console's team page)"
        )


def view(tenant: Tenant) -> dict:
    """``GET /tool-hosts``: the list and the plan's bound on it."""
    return {"hosts": list(tenant.allowed_tool_hosts), "max_hosts": plan_limits(tenant).max_tool_hosts}
