"""``GET /runs/<id>/trace``: where a run's time went, as a span tree (JSON) or in the Chrome
trace-event format (``?format=chrome``). A run of another tenant is a 404, as for the run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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


#: The ``?format=`` query parameter of every view that answers in both trace formats.
FORMAT_PARAMETER = OpenApiParameter("format", str, enum=list(TRACE_FORMATS), description="`json` (default) or `chrome`")


class TraceFormatView(APIView):
    """A view that answers JSON, or with ``?format=chrome`` the same data as Chrome trace events
    (Perfetto, chrome://tracing): the run trace and the staff engine timeline."""

    renderer_classes = [JSONRenderer, ChromeTraceRenderer]
    content_negotiation_class = TraceFormatNegotiation

    def respond(self, request, data: Any, to_chrome: Callable[[Any], Any]) -> Response:
        if request.accepted_renderer.format == "chrome":
            return Response(to_chrome(data))
        return Response(data)


class RunTraceView(TraceFormatView):
    """Where the run's time went: its span tree, or with ``?format=chrome`` trace events for
    Perfetto. A run of another tenant is a 404."""

    permission_classes = [IsTenantMember]
    required_scope = "runs"

    @extend_schema(
        operation_id="runs_trace",
        parameters=[FORMAT_PARAMETER],
        responses={
            200: OpenApiResponse(RunTraceSerializer, description="the span tree; with `format=chrome`, trace events"),
            404: OpenApiResponse(description="no such run in the tenant"),
        },
    )
    def get(self, request, run_id):
        run = get_object_or_404(Run.objects.defer("stdout", "stderr"), pk=run_id, tenant=active_tenant(request))
        return self.respond(request, run_traces.trace_tree(run), run_traces.chrome_trace)
