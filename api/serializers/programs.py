"""Programs, their versions and uploads (api/views/programs.py)."""

from __future__ import annotations

from rest_framework import serializers

from api import parsers
from api.models import Program, ProgramVersion
from api.services import programs
from api.validators import storable_json


class ProgramVersionSerializer(serializers.ModelSerializer):
    class Meta:
        model = ProgramVersion
        fields = ["number", "kind", "sha256", "size", "created_at"]


class BoundedJSONField(serializers.JSONField):
    """A JSON form field (``default_args`` of a multipart upload): one nested too deeply for
    Python's json module is a 400 like a too-deep JSON body (api/parsers.py), not a
    RecursionError. Its value still goes through the field's validators (``storable_json``)."""

    def to_internal_value(self, data: object) -> object:
        try:
            return super().to_internal_value(data)
        except RecursionError:
            raise serializers.ValidationError(parsers.TOO_DEEP) from None


class ProgramSerializer(serializers.ModelSerializer):
    file = serializers.FileField(write_only=True)
    default_args = BoundedJSONField(required=False)
    latest_version = serializers.SerializerMethodField()

    class Meta:
        model = Program
        fields = ["id", "name", "description", "default_args", "created_at", "latest_version", "file"]
        read_only_fields = ["id", "created_at", "latest_version"]

    def validate_name(self, value: str) -> str:
        """Names appear in URLs, CLI arguments and ``tenant/name`` labels: no path separators or
        control characters (spaces around it are trimmed by the field)."""
        bad = sorted({c for c in value if c in "/\\" or ord(c) < 32 or ord(c) == 127})
        if bad:
            shown = ", ".join(repr(c) for c in bad)
            raise serializers.ValidationError(f"must not contain {shown}: use letters, digits, '-', '_' or '.'.")
        return value

    def validate_default_args(self, value: object) -> object:
        return storable_json(value)

    def validate(self, attrs: dict) -> dict:
        """Without ``default_args``, a ``.py`` program's declared example (an ``Example args:``
        line of its docstring, api/services/programs.py) becomes them, so the console's run form
        opens with arguments that work rather than ``{}``."""
        upload = attrs.get("file")
        if upload is not None and upload.name.endswith(".py"):
            source = upload.read()
            upload.seek(0)
            example = programs.declared_example_args(source) if "default_args" not in attrs else None
            if example is not None:
                attrs["default_args"] = example
            # Likewise an empty description: the docstring's first paragraph says what it does.
            if not attrs.get("description"):
                attrs["description"] = programs.declared_description(source)
        return attrs

    def get_latest_version(self, obj: Program) -> int | None:
        return obj.versions.order_by("-number").values_list("number", flat=True).first()


class VersionUploadSerializer(serializers.Serializer):
    file = serializers.FileField()
