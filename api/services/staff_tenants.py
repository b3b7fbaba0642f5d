"""What staff change on a tenant from the console's staff page: its plan (closing goes through
api/services/tenant_closure.py with ``by_staff``). Every change leaves an audit row."""

from __future__ import annotations

from django.db import transaction

from api.models import AuditLog, Plan, Tenant
from api.services.members import NotAllowed
from api.services.tenant_closure import TenantClosed


class UnknownPlan(ValueError):
    """No plan of that name: HTTP 400 next to the ``plan`` field."""


def plan_names() -> list[str]:
    return list(Plan.objects.order_by("name").values_list("name", flat=True))


def change_plan(actor, tenant: Tenant, plan: str) -> Tenant:
    """Move ``tenant`` to ``plan`` (a Plan's name); its limits apply to runs started from now on."""
    if not actor.is_staff:
        raise NotAllowed("only staff can change a tenant's plan")
    if not Plan.objects.filter(name=plan).exists():
        raise UnknownPlan(f"no plan named {plan!r}; plans: {', '.join(plan_names()) or 'none'}")
    with transaction.atomic():
        locked = Tenant.objects.select_for_update().get(pk=tenant.pk)
        if locked.closed_at is not None:
            raise TenantClosed("this tenant is closed")
        before = locked.plan
        if before != plan:
            locked.plan = plan
            locked.save(update_fields=["plan"])
            AuditLog.objects.create(
                actor=actor,
                tenant=locked,
                action="tenant.plan",
                target=locked.slug,
                detail={"from": before, "to": plan},
            )
    return locked
