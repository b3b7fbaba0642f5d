"""The tenant's tool-host allowlist (the hosts its runs' brokered I/O may reach)."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from api.serializers.tool_hosts import ToolHostsSerializer
from api.services import tool_hosts
from api.tenancy import IsTenantMember, active_tenant
from api.views._shared import _console_user


class ToolHostsView(APIView):
    """The tenant's tool-host allowlist: members and ``runs`` keys read it, owners (console)
    replace it within the plan's ``max_tool_hosts``."""

    permission_classes = [IsTenantMember]
    required_scope = "runs"

    @extend_schema(request=None, responses=OpenApiTypes.OBJECT)
    def get(self, request):
        return Response(tool_hosts.view(active_tenant(request)))

    @extend_schema(request=ToolHostsSerializer, responses=OpenApiTypes.OBJECT)
    def put(self, request):
        data = ToolHostsSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        tenant = active_tenant(request)
        tool_hosts.set_hosts(_console_user(request), tenant, data.validated_data["hosts"])
        return Response(tool_hosts.view(tenant))
