"""Helpers the account and team views share: who is signed in, and refusing API keys."""

from __future__ import annotations

from rest_framework.exceptions import PermissionDenied

from api.authentication import ApiKeyUser
from api.models import Membership, Tenant
from api.services import accounts
from api.tenancy import active_tenant


def _me(request) -> dict:
    """Who is signed in, their tenants and the active one (``None`` once they belong to none,
    e.g. removed from their only tenant: the console then offers to create one)."""
    user = request.user
    if isinstance(user, ApiKeyUser):
        key_tenant = user.key.tenant
        return {
            "user": None,
            "tenants": [{"id": key_tenant.pk, "name": key_tenant.name, "slug": key_tenant.slug, "role": "api-key"}],
            "active_tenant": key_tenant.pk,
        }
    try:
        tenant: Tenant | None = active_tenant(request)
    except PermissionDenied:
        tenant = None
    members = Membership.objects.filter(user=user).select_related("tenant").order_by("id")
    return {
        "user": {
            "id": user.pk,
            "email": user.email,
            "is_staff": user.is_staff,
            "email_verified": accounts.is_verified(user),
        },
        "tenants": [{"id": m.tenant.pk, "name": m.tenant.name, "slug": m.tenant.slug, "role": m.role} for m in members],
        "active_tenant": tenant.pk if tenant else None,
    }


def _console_user(request):
    """The signed-in console user; API keys are refused (they belong to a tenant, not a person)."""
    if isinstance(request.user, ApiKeyUser):
        raise PermissionDenied("API keys cannot manage accounts or teams: use the console")
    return request.user


def _verified_user(request) -> None:
    """Refuse (403 ``email_unverified``) a console user who has not verified their address: they
    may not mint keys, upload programs or start runs. An API key's request passes (only a
    verified user could mint it)."""
    if not isinstance(request.user, ApiKeyUser):
        accounts.require_verified(request.user)
