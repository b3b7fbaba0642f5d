"""Staff changes to a tenant: its plan (api/views/staff_tenants.py; closing one reuses
``TenantCloseSerializer`` of api/serializers/team.py)."""

from __future__ import annotations

from rest_framework import serializers


class StaffTenantPlanSerializer(serializers.Serializer):
    plan = serializers.CharField(max_length=32)
