"""The tenant's KV files, also listed to staff (api/views/kv.py, api/views/staff.py)."""

from __future__ import annotations

from datetime import UTC, datetime

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from api.models import KVFile


@extend_schema_field(OpenApiTypes.DATETIME)
class EpochAsISOField(serializers.Field):
    """Unix seconds stored as the worker reports them, shown as ISO 8601 like every other
    timestamp of the API."""

    def to_representation(self, value: float) -> str:
        return datetime.fromtimestamp(float(value), tz=UTC).isoformat().replace("+00:00", "Z")


class KVFileSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    last_used = EpochAsISOField(read_only=True, allow_null=True)

    class Meta:
        model = KVFile
        fields = ["id", "tenant", "worker", "name", "tokens", "bytes", "residency", "pinned", "last_used", "synced_at"]
        read_only_fields = fields


class PinSerializer(serializers.Serializer):
    pinned = serializers.BooleanField()
