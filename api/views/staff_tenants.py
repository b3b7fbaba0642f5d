"""Staff-only tenant actions of the console's staff page: list the plans, change a tenant's
plan, close a tenant. Thin: the logic is in api/services/staff_tenants.py and
api/services/tenant_closure.py."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.exceptions import ValidationError
from rest_framework.generics import get_object_or_404
from rest_framework.permissions import IsAdminUser
from rest_framework.response import Response
from rest_framework.views import APIView

from api.models import Tenant
from api.serializers.staff_tenants import StaffTenantPlanSerializer
from api.serializers.team import TenantCloseSerializer
from api.services import staff_tenants, tenant_closure


def _tenant_row(tenant: Tenant) -> dict:
    return {
        "id": tenant.pk,
        "slug": tenant.slug,
        "name": tenant.name,
        "plan": tenant.plan,
        "closed_at": tenant.closed_at,
    }


class StaffPlansView(APIView):
    permission_classes = [IsAdminUser]

    @extend_schema(request=None, responses=OpenApiTypes.OBJECT)
    def get(self, request):
        return Response({"plans": staff_tenants.plan_names()})


class StaffTenantDetailView(APIView):
    """``PATCH {"plan": name}``: move the tenant to another plan."""

    permission_classes = [IsAdminUser]

    @extend_schema(request=StaffTenantPlanSerializer, responses=OpenApiTypes.OBJECT)
    def patch(self, request, tenant_id: int):
        data = StaffTenantPlanSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        tenant = get_object_or_404(Tenant, pk=tenant_id)
        try:
            tenant = staff_tenants.change_plan(request.user, tenant, data.validated_data["plan"])
        except staff_tenants.UnknownPlan as exc:
            raise ValidationError({"plan": [str(exc)]}) from exc
        return Response(_tenant_row(tenant))


class StaffTenantCloseView(APIView):
    """``POST {"confirm": slug}``: close a tenant staff do not own (as the Django admin's action)."""

    permission_classes = [IsAdminUser]

    @extend_schema(request=TenantCloseSerializer, responses=OpenApiTypes.OBJECT)
    def post(self, request, tenant_id: int):
        data = TenantCloseSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        tenant = get_object_or_404(Tenant, pk=tenant_id)
        try:
            tenant_closure.close(request.user, tenant, data.validated_data["confirm"], by_staff=True)
        except tenant_closure.ConfirmationMismatch as exc:
            raise ValidationError({"confirm": [str(exc)]}) from exc
        tenant.refresh_from_db()
        return Response(_tenant_row(tenant))
