"""Tenant resolution and the TenantScopedViewSet base: every tenant resource inherits it, so no
view can forget to scope its queryset or to stamp the tenant on create."""

from __future__ import annotations

from rest_framework import exceptions, permissions, viewsets

from api.authentication import ApiKeyUser
from api.models import Membership, Tenant

SESSION_TENANT_KEY = "active_tenant"


def active_tenant(request) -> Tenant:
    """The API key's tenant, or the console session's active tenant (a membership is required)."""
    user = request.user
    if isinstance(user, ApiKeyUser):
        return user.key.tenant
    memberships = Membership.objects.filter(user=user, tenant__closed_at__isnull=True).select_related("tenant")
    wanted = request.session.get(SESSION_TENANT_KEY)
    chosen = memberships.filter(tenant_id=wanted).first() if wanted else None
    chosen = chosen or memberships.order_by("id").first()
    if chosen is None:
        raise exceptions.PermissionDenied("you are not a member of any tenant")
    return chosen.tenant


#: What an API key may be allowed to do. Managing API keys is not among them: a leaked key
#: must not be able to mint or revoke keys (that is the console's job, under session auth).
KEY_SCOPES = ("programs", "runs", "kv", "usage")


class IsTenantMember(permissions.BasePermission):
    """Authenticated, and an API key carries the view's ``required_scope``.

    A view without ``required_scope`` is console-only for API keys (refused)."""

    message = "this API key lacks the scope for this endpoint"

    def has_permission(self, request, view) -> bool:
        user = request.user
        if not (user and user.is_authenticated):
            return False
        if isinstance(user, ApiKeyUser):
            scope = getattr(view, "required_scope", None)
            return scope is not None and scope in user.key.scopes
        return True


class TenantScopedViewSet(viewsets.GenericViewSet):
    """Base for tenant resources. Subclasses set ``queryset`` and ``tenant_field``."""

    permission_classes = [IsTenantMember]
    tenant_field = "tenant"
    #: The API key scope this resource needs (see KEY_SCOPES); ``None``: console only.
    required_scope: str | None = None

    @property
    def tenant(self) -> Tenant:
        if not hasattr(self, "_tenant"):
            self._tenant = active_tenant(self.request)
        return self._tenant

    def get_queryset(self):
        return super().get_queryset().filter(**{self.tenant_field: self.tenant})
