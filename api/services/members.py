"""Who belongs to a tenant: members and their roles, invitations, and new tenants.

Roles: an ``owner`` manages the team (invites, role changes, removals) and every API key; a
``member`` uses everything else (programs, runs, KV files, usage) and manages the API keys they
created (api/services/keys.py). A tenant always keeps at least one
owner, and every change here leaves an AuditLog row, because membership decides who can spend
the tenant's quota and read its programs.

Invitations carry a one-time token shown once to the inviting owner (no mail is sent; the
console shows the link to pass on). Only an HMAC of the token is stored, and accepting needs a
signed-in user whose email is the invited one.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.http import Http404
from django.utils import timezone
from django.utils.text import slugify

from api.models import ApiKey, AuditLog, Invitation, Membership, Tenant
from api.services.keys import secret_digest, secret_digests

OWNER, MEMBER = "owner", "member"
TOKEN_PREFIX = "inv_"  # noqa: S105 (a marker, not a secret)


class MembershipConflict(Exception):
    """The change would break a rule of the team (last owner, already a member): HTTP 409."""


class NotAllowed(Exception):
    """The caller's role does not allow this change: HTTP 403."""


class InvitationInvalid(Exception):
    """Unknown, used, revoked or expired invitation token: HTTP 404 (which one is not said)."""


class TooManyTenants(Exception):
    """The user already owns SYMPHONY_MAX_OWNED_TENANTS tenants: HTTP 429 (each gets free quota)."""


@dataclass(frozen=True)
class IssuedInvitation:
    invitation: Invitation
    token: str  # shown once, like an API key's secret


def role_of(user, tenant: Tenant) -> str | None:
    return Membership.objects.filter(user=user, tenant=tenant).values_list("role", flat=True).first()


def require_owner(user, tenant: Tenant) -> None:
    if role_of(user, tenant) != OWNER:
        raise NotAllowed("only an owner of this tenant can manage its members and invitations")


def _audit(actor, tenant: Tenant, action: str, target: str, **detail) -> None:
    AuditLog.objects.create(actor=actor, tenant=tenant, action=action, target=target[:200], detail=detail)


def _lock_team(membership: Membership) -> Membership:
    """Lock the tenant row, then re-read the membership: team changes of one tenant run one at a
    time, so two owners demoting each other at once cannot both pass the last-owner check (and
    row locks taken in one order cannot deadlock)."""
    Tenant.objects.select_for_update().filter(pk=membership.tenant_id).first()
    current = Membership.objects.select_related("user", "tenant").filter(pk=membership.pk).first()
    if current is None:
        raise Http404("no such member (removed meanwhile)")
    return current


def _other_owners(membership: Membership) -> bool:
    return Membership.objects.filter(tenant_id=membership.tenant_id, role=OWNER).exclude(pk=membership.pk).exists()


@transaction.atomic
def change_role(actor, membership: Membership, role: str) -> Membership:
    """An owner sets a member's role; the last owner cannot step down."""
    membership = _lock_team(membership)
    require_owner(actor, membership.tenant)
    if membership.role == OWNER and role != OWNER and not _other_owners(membership):
        raise MembershipConflict("a tenant needs at least one owner: make someone else owner first")
    if membership.role != role:
        _audit(actor, membership.tenant, "member.role", membership.user.email, old=membership.role, new=role)
        membership.role = role
        membership.save(update_fields=["role"])
    return membership


@transaction.atomic
def remove(actor, membership: Membership) -> None:
    """An owner removes anyone; a member may only leave. The last owner cannot go.

    The API keys the person created for this tenant are revoked with the membership."""
    membership = _lock_team(membership)
    if membership.user_id != actor.pk:
        require_owner(actor, membership.tenant)
    if membership.role == OWNER and not _other_owners(membership):
        raise MembershipConflict("a tenant needs at least one owner: make someone else owner first")
    # Keys the person minted for this tenant go with them: they hold the secrets.
    revoked = ApiKey.objects.filter(
        tenant_id=membership.tenant_id, created_by_id=membership.user_id, revoked_at__isnull=True
    ).update(revoked_at=timezone.now())
    action = "member.leave" if membership.user_id == actor.pk else "member.remove"
    _audit(actor, membership.tenant, action, membership.user.email, role=membership.role, keys_revoked=revoked)
    membership.delete()


def pending(tenant: Tenant):
    """Invitations that can still be accepted, newest first."""
    return Invitation.objects.filter(
        tenant=tenant, accepted_at__isnull=True, revoked_at__isnull=True, expires_at__gt=timezone.now()
    ).order_by("-created_at")


@transaction.atomic
def invite(actor, tenant: Tenant, email: str, role: str) -> IssuedInvitation:
    """Issue an invitation (replacing a pending one to the same address) and return its token."""
    require_owner(actor, tenant)
    email = email.lower()
    if Membership.objects.filter(tenant=tenant, user__username=email).exists():
        raise MembershipConflict(f"{email} is already a member of this tenant")
    now = timezone.now()
    pending(tenant).filter(email=email).update(revoked_at=now)
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    invitation = Invitation.objects.create(
        tenant=tenant,
        email=email,
        role=role,
        token_hash=secret_digest(token),
        invited_by=actor,
        expires_at=now + timedelta(days=settings.SYMPHONY_INVITATION_DAYS),
    )
    _audit(actor, tenant, "invitation.create", email, role=role, invitation=invitation.pk)
    return IssuedInvitation(invitation=invitation, token=token)


@transaction.atomic
def revoke(actor, invitation: Invitation) -> None:
    require_owner(actor, invitation.tenant)
    if invitation.accepted_at is None and invitation.revoked_at is None:
        invitation.revoked_at = timezone.now()
        invitation.save(update_fields=["revoked_at"])
        _audit(actor, invitation.tenant, "invitation.revoke", invitation.email, invitation=invitation.pk)


def find(token: str) -> Invitation:
    """The pending invitation with this token, or InvitationInvalid."""
    if not token.startswith(TOKEN_PREFIX) or len(token) > 100:
        raise InvitationInvalid("no such invitation, or it was used, revoked or has expired")
    invitation = (
        Invitation.objects.select_related("tenant", "invited_by")
        .filter(token_hash__in=secret_digests(token), accepted_at__isnull=True, revoked_at__isnull=True)
        .filter(expires_at__gt=timezone.now())
        .first()
    )
    if invitation is None:
        raise InvitationInvalid("no such invitation, or it was used, revoked or has expired")
    return invitation


@transaction.atomic
def accept(user, token: str) -> Membership:
    """Join the invitation's tenant as ``user``, whose email must be the invited one."""
    invitation = find(token)
    invitation = Invitation.objects.select_for_update().get(pk=invitation.pk)
    if invitation.accepted_at is not None or invitation.revoked_at is not None:
        raise InvitationInvalid("no such invitation, or it was used, revoked or has expired")
    if (user.email or user.username).lower() != invitation.email:
        raise NotAllowed("this invitation is for another email address: sign in as the invited user")
    try:
        with transaction.atomic():
            membership = Membership.objects.create(user=user, tenant=invitation.tenant, role=invitation.role)
    except IntegrityError as exc:
        raise MembershipConflict("you are already a member of this tenant") from exc
    invitation.accepted_at = timezone.now()
    invitation.accepted_by = user
    invitation.save(update_fields=["accepted_at", "accepted_by"])
    _audit(user, invitation.tenant, "invitation.accept", invitation.email, role=invitation.role)
    return membership


def _unique_slug(name: str) -> str:
    base = slugify(name)[:50] or "tenant"
    slug, n = base, 1
    while Tenant.objects.filter(slug=slug).exists():
        n += 1
        slug = f"{base}-{n}"
    return slug


def _insert_tenant(name: str, account) -> Tenant:
    """Insert with a free slug. Two sign-ups with the same name at once can both see the same
    slug free; the loser of the unique index gets a random suffix instead of an error."""
    slug = _unique_slug(name)
    for _ in range(5):
        try:
            with transaction.atomic():
                return Tenant.objects.create(name=name, slug=slug, account=account)
        except IntegrityError:
            slug = f"{slug[:50]}-{secrets.token_hex(3)}"
    raise IntegrityError(f"no free slug for tenant {name!r}")


@transaction.atomic
def create_tenant(user, name: str) -> Tenant:
    """A new tenant on the default plan with ``user`` as its owner.

    Bounded per user, since every tenant comes with its own free-plan quota."""
    owned = Membership.objects.filter(user=user, role=OWNER).count()
    if owned >= settings.SYMPHONY_MAX_OWNED_TENANTS:
        raise TooManyTenants(f"you already own {owned} tenants (the limit is {settings.SYMPHONY_MAX_OWNED_TENANTS})")
    tenant = _insert_tenant(name, account=user)
    Membership.objects.create(user=user, tenant=tenant, role=OWNER)
    _audit(user, tenant, "tenant.create", tenant.slug)
    return tenant
