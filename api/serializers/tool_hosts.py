"""The tenant's tool-host allowlist (api/views/tool_hosts.py)."""

from __future__ import annotations

from rest_framework import serializers

from api.validators import reject_nul


class ToolHostsSerializer(serializers.Serializer):
    """``PUT /tool-hosts``: the whole list (``host`` or ``host:port`` entries)."""

    hosts = serializers.ListField(
        child=serializers.CharField(max_length=260, validators=[reject_nul]), max_length=1000, allow_empty=True
    )
