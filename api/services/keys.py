"""API key issue, verify and revoke. Keys look like ``sk_<prefix>_<secret>``; only an HMAC-SHA256
of the secret (keyed with SECRET_KEY) is stored, so a database leak does not leak usable keys."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.utils import timezone

from api.models import ApiKey, Tenant


@dataclass(frozen=True)
class IssuedKey:
    key: ApiKey
    secret: str  # the full "sk_..." string; shown once


def secret_digest(secret: str) -> str:
    """HMAC-SHA256 of a bearer secret (API key or invitation token), keyed with SECRET_KEY."""
    return hmac.new(settings.SECRET_KEY.encode(), secret.encode(), hashlib.sha256).hexdigest()


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


def verify_key(raw: str) -> ApiKey | None:
    """The live key matching ``raw`` (constant-time compare), or None; touches last_used_at."""
    parts = raw.split("_", 2)
    if len(parts) != 3 or parts[0] != "sk":
        return None
    key = ApiKey.objects.select_related("tenant").filter(prefix=parts[1]).first()
    if key is None or not hmac.compare_digest(key.secret_hash, secret_digest(parts[2])):
        return None
    now = timezone.now()
    if key.revoked_at is not None or (key.expires_at is not None and key.expires_at <= now):
        return None
    ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
    return key


def revoke_key(key: ApiKey) -> None:
    if key.revoked_at is None:
        key.revoked_at = timezone.now()
        key.save(update_fields=["revoked_at"])
