"""What a tenant used and owes: quota, daily usage, invoices."""

from __future__ import annotations

from datetime import date

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from api.services import billing, quotas
from api.tenancy import IsTenantMember, active_tenant


class QuotaView(APIView):
    permission_classes = [IsTenantMember]
    required_scope = "usage"

    @extend_schema(request=None, responses=OpenApiTypes.OBJECT)
    def get(self, request):
        return Response(quotas.quota_view(active_tenant(request)))


class UsageView(APIView):
    permission_classes = [IsTenantMember]
    required_scope = "usage"

    @extend_schema(
        request=None,
        responses=OpenApiTypes.OBJECT,
        parameters=[
            OpenApiParameter("from", OpenApiTypes.DATE, description="first UTC day (inclusive)"),
            OpenApiParameter("to", OpenApiTypes.DATE, description="last UTC day (inclusive)"),
            OpenApiParameter(
                "group_by",
                OpenApiTypes.STR,
                enum=list(billing.GROUPINGS),
                description="also sum the range per program or per API key (`groups`)",
            ),
        ],
    )
    def get(self, request):
        try:
            start = date.fromisoformat(request.query_params["from"]) if "from" in request.query_params else None
            end = date.fromisoformat(request.query_params["to"]) if "to" in request.query_params else None
        except ValueError as exc:
            raise ValidationError({"from/to": "dates must be YYYY-MM-DD"}) from exc
        tenant = active_tenant(request)
        body: dict = {"days": billing.usage_by_day(tenant, start, end)}
        group_by = request.query_params.get("group_by")
        if group_by is not None:
            if group_by not in billing.GROUPINGS:
                raise ValidationError({"group_by": f"one of {', '.join(billing.GROUPINGS)}"})
            body["groups"] = billing.usage_by_group(tenant, group_by, start, end)
        return Response(body)


class InvoiceListView(APIView):
    permission_classes = [IsTenantMember]
    required_scope = "usage"

    @extend_schema(operation_id="invoices_list", request=None, responses=OpenApiTypes.OBJECT)
    def get(self, request):
        tenant = active_tenant(request)
        return Response([billing.invoice(tenant, month) for month in billing.invoice_months(tenant)])


class InvoiceDetailView(APIView):
    permission_classes = [IsTenantMember]
    required_scope = "usage"

    @extend_schema(operation_id="invoices_retrieve", request=None, responses=OpenApiTypes.OBJECT)
    def get(self, request, month: str):
        try:
            return Response(billing.invoice(active_tenant(request), month))
        except ValueError as exc:  # the URL admits months outside datetime.date (0000-01, 9999-12)
            raise NotFound(f"no invoice for month {month}") from exc
