"""API keys (api/views/keys.py)."""

from __future__ import annotations

from datetime import datetime

from django.utils import timezone
from rest_framework import serializers

from api.models import ApiKey
from api.tenancy import KEY_SCOPES


class ApiKeySerializer(serializers.ModelSerializer):
    """An API key. A new one needs at least one scope (all four when ``scopes`` is left out) and
    an ``expires_at`` in the future, if any: a key without either could only ever be refused."""

    scopes = serializers.ListField(
        child=serializers.ChoiceField(choices=KEY_SCOPES),
        required=False,
        allow_empty=False,
        max_length=len(KEY_SCOPES),
        default=lambda: list(KEY_SCOPES),
    )

    class Meta:
        model = ApiKey
        fields = ["id", "name", "prefix", "scopes", "created_at", "expires_at", "last_used_at", "revoked_at"]
        read_only_fields = ["id", "prefix", "created_at", "last_used_at", "revoked_at"]

    def validate_scopes(self, value: list[str]) -> list[str]:
        return list(dict.fromkeys(value))

    def validate_expires_at(self, value: datetime | None) -> datetime | None:
        if value is not None and value <= timezone.now():
            raise serializers.ValidationError("expires_at must be in the future.")
        return value
