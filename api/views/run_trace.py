"""``GET /runs/<id>/trace``: where a run's time went, as a span tree (JSON) or in the Chrome
trace-event format (``?format=chrome``). A run of another tenant is a 404, as for the run."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.exceptions import ValidationError
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from api.models import Run
from api.serializers.run_trace import TRACE_FORMATS, RunTraceQuerySerializer, RunTraceSerializer
from api.services import run_traces
from api.tenancy import IsTenantMember, active_tenant


class ChromeTraceRenderer(JSONRenderer):
    """JSON like the default renderer, chosen by ``?format=chrome``."""

    format = "chrome"


class TraceFormatNegotiation(DefaultContentNegotiation):
    """``?format=`` is this view's own parameter: an unknown value is a 400 naming the formats,
    not DRF's bare 404 for a format no renderer has."""

    def select_renderer(self, request, renderers, format_suffix=None):
        query = RunTraceQuerySerializer(data=request.query_params)
        if not query.is_valid():
            raise ValidationError(query.errors)
        return super().select_renderer(request, renderers, format_suffix)


class RunTraceView(APIView):
    permission_classes = [IsTenantMember]
    required_scope = "runs"
    renderer_classes = [JSONRenderer, ChromeTraceRenderer]
    content_negotiation_class = TraceFormatNegotiation

    @extend_schema(
        operation_id="runs_trace",
        parameters=[
            OpenApiParameter("format", str, enum=list(TRACE_FORMATS), description="`json` (default) or `chrome`")
        ],
        responses={
            200: OpenApiResponse(RunTraceSerializer, description="the span tree; with `format=chrome`, trace events"),
            404: OpenApiResponse(description="no such run in the tenant"),
        },
    )
    def get(self, request, run_id):
        run = get_object_or_404(Run.objects.defer("stdout", "stderr"), pk=run_id, tenant=active_tenant(request))
        tree = run_traces.trace_tree(run)
        if request.accepted_renderer.format == "chrome":
            return Response(run_traces.chrome_trace(tree))
        return Response(tree)
