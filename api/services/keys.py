"""API key issue, verify and revoke. Keys look like ``sk_<prefix>_<secret>``; only an HMAC-SHA256
of the secret (keyed with SECRET_KEY) is stored, so a database leak does not leak usable keys.

Rotating SECRET_KEY follows Django's own scheme: the old key moves to SECRET_KEY_FALLBACKS
(``DJANGO_SECRET_KEY_FALLBACKS``), where it still verifies keys and invitation links; a key that
verifies under a fallback is re-hashed under the new key on that use, so once every live key has
been used (or after the keys' rotation period) the fallback can be dropped."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from api.compiled_queries import CompiledQuery
from api.models import ApiKey, AuditLog, Membership, Tenant


@dataclass(frozen=True)
class IssuedKey:
    key: ApiKey
    secret: str  # the full "sk_..." string; shown once


def _hmac(signing_key: str, secret: str) -> str:
    return hmac.new(signing_key.encode(), secret.encode(), hashlib.sha256).hexdigest()


def secret_digest(secret: str) -> str:
    """HMAC-SHA256 of a bearer secret (API key or invitation token), keyed with SECRET_KEY."""
    return _hmac(settings.SECRET_KEY, secret)


def secret_digests(secret: str) -> list[str]:
    """The digests ``secret`` may be stored under: SECRET_KEY's first, then each fallback's."""
    return [_hmac(k, secret) for k in (settings.SECRET_KEY, *settings.SECRET_KEY_FALLBACKS)]


def issue_key(
    tenant: Tenant, name: str, scopes: list[str], created_by=None, expires_at: datetime | None = None
) -> IssuedKey:
    """Create a key and return its plaintext once."""
    prefix = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    key = ApiKey.objects.create(
        tenant=tenant,
        name=name,
        prefix=prefix,
        secret_hash=secret_digest(secret),
        scopes=scopes,
        created_by=created_by,
        expires_at=expires_at,
    )
    return IssuedKey(key=key, secret=f"sk_{prefix}_{secret}")


#: How fresh ``last_used_at`` is kept: written at most once per key in this interval, so a busy
#: key's requests do not each pay for an UPDATE (and queue on its row lock) to move it by seconds.
LAST_USED_GRANULARITY = timedelta(minutes=1)


#: The key with its tenant by its public prefix: read by every request with a key, so compiled
#: once a process (api/compiled_queries.py).
KEY_BY_PREFIX: CompiledQuery[ApiKey] = CompiledQuery(
    lambda prefix: ApiKey.objects.select_related("tenant").filter(prefix=prefix).order_by("pk")[:1],
    markers=("compiled-query-marker",),
)


def verify_key(raw: str) -> ApiKey | None:
    """The live key matching ``raw`` (constant-time compare), or None; touches last_used_at."""
    parts = raw.split("_", 2)
    if len(parts) != 3 or parts[0] != "sk":
        return None
    key = KEY_BY_PREFIX.first(parts[1])
    if key is None:
        return None
    digests = secret_digests(parts[2])
    # Every candidate is compared (no early exit), so timing does not tell which one matched.
    matches = [hmac.compare_digest(key.secret_hash, digest) for digest in digests]
    if not any(matches):
        return None
    now = timezone.now()
    if key.revoked_at is not None or (key.expires_at is not None and key.expires_at <= now):
        return None
    if key.tenant.closed_at is not None:  # revoked when it closed; this holds if that ever fails
        return None
    changes: dict = {}
    if key.last_used_at is None or now - key.last_used_at >= LAST_USED_GRANULARITY:
        changes["last_used_at"] = now
    if not matches[0]:
        changes["secret_hash"] = key.secret_hash = digests[0]  # verified under a fallback: re-hash
    if changes:
        ApiKey.objects.filter(pk=key.pk).update(**changes)
    return key


def revoke_key(key: ApiKey) -> None:
    if key.revoked_at is None:
        key.revoked_at = timezone.now()
        key.save(update_fields=["revoked_at"])


def manageable_keys(user, tenant: Tenant) -> QuerySet[ApiKey]:
    """The tenant's keys ``user`` may list and revoke: every key for an owner, the keys they
    created themselves for a member. A member holding the secret of a key they made can already
    do what it does; revoking or seeing an owner's keys would let any member cut off the
    owner's integrations (or learn what they are)."""
    keys = ApiKey.objects.filter(tenant=tenant)
    role = Membership.objects.filter(user=user, tenant=tenant).values_list("role", flat=True).first()
    return keys if role == "owner" else keys.filter(created_by=user)


def audit(actor, key: ApiKey, action: str, **detail) -> None:
    """One audit row about ``key`` in its tenant's log."""
    target = f"{key.name} (sk_{key.prefix})"[:200]
    AuditLog.objects.create(actor=actor, tenant_id=key.tenant_id, action=action, target=target, detail=detail)


@transaction.atomic
def create_key(actor, tenant: Tenant, name: str, scopes: list[str], expires_at: datetime | None = None) -> IssuedKey:
    """A console user mints a key for ``tenant``: an ``api_key.create`` audit row names who,
    with which scopes and until when, since the secret leaves the service with them."""
    issued = issue_key(tenant, name, scopes, actor, expires_at)
    audit(
        actor,
        issued.key,
        "api_key.create",
        scopes=list(scopes),
        expires_at=expires_at.isoformat() if expires_at else None,
    )
    return issued


@transaction.atomic
def revoke_by(actor, key: ApiKey, reason: str | None = None) -> None:
    """A console user revokes ``key`` (one of :func:`manageable_keys`); audited once, when it
    actually ends the key. ``reason``: why, when not the actor's own choice (``password_reset``)."""
    key = ApiKey.objects.select_for_update().get(pk=key.pk)
    if key.revoked_at is not None:
        return
    revoke_key(key)
    creator = key.created_by.email if key.created_by_id else None
    extra = {"reason": reason} if reason else {}
    audit(actor, key, "api_key.revoke", created_by=creator, **extra)
