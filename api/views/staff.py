"""Staff-only views: live workers and their engine timelines, every tenant, every tenant's KV
files."""

from __future__ import annotations

from django.db.models import Count, Q
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound
from rest_framework.permissions import IsAdminUser
from rest_framework.response import Response
from rest_framework.views import APIView

from api.models import KVFile, Tenant
from api.serializers.engine_timeline import EngineTimelineSerializer
from api.serializers.kv import KVFileSerializer
from api.services import engine_timeline, kvfiles, routing
from api.views.run_trace import FORMAT_PARAMETER, TraceFormatView


class StaffWorkersView(APIView):
    """Staff only: every worker with a live heartbeat, as its ``health`` op reports itself
    (pages, sessions, batch occupancy, queue depth, forward time)."""

    permission_classes = [IsAdminUser]

    @extend_schema(request=None, responses=OpenApiTypes.OBJECT)
    def get(self, request):
        return Response(sorted((w.health for w in routing.live_workers()), key=lambda h: str(h.get("name"))))


class StaffWorkerTimelineView(TraceFormatView):
    """Staff only: the worker's last forwards (start, duration, batch size, prompt and decode
    tokens, tokens per account), read from the worker; ``?format=chrome`` for Perfetto."""

    permission_classes = [IsAdminUser]

    @extend_schema(
        operation_id="staff_worker_timeline",
        parameters=[FORMAT_PARAMETER],
        responses={
            200: OpenApiResponse(
                EngineTimelineSerializer, description="the forwards, oldest first; with `format=chrome`, trace events"
            ),
            403: OpenApiResponse(description="not staff"),
            404: OpenApiResponse(description="no live worker of that name"),
            503: OpenApiResponse(description="the worker could not be asked"),
        },
    )
    def get(self, request, name):
        try:
            timeline = engine_timeline.read(name)
        except engine_timeline.UnknownWorker:
            raise NotFound("no live worker of that name") from None
        return self.respond(request, timeline, engine_timeline.chrome_trace)


class StaffTenantListView(APIView):
    """Staff only: every tenant with its member, program and active-run counts."""

    permission_classes = [IsAdminUser]

    @extend_schema(request=None, responses=OpenApiTypes.OBJECT)
    def get(self, request):
        tenants = Tenant.objects.annotate(
            members=Count("memberships", distinct=True),
            program_count=Count("programs", distinct=True),
            active_runs=Count("runs", filter=Q(runs__status__in=["queued", "running"]), distinct=True),
        ).order_by("slug")
        return Response(
            [
                {
                    "id": t.pk,
                    "slug": t.slug,
                    "name": t.name,
                    "plan": t.plan,
                    "members": t.members,
                    "programs": t.program_count,
                    "active_runs": t.active_runs,
                    "closed_at": t.closed_at,
                    "purged_at": t.purged_at,
                }
                for t in tenants
            ]
        )


class StaffKVFileViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """Staff: every tenant's mirrored KV files, and audited eviction."""

    permission_classes = [IsAdminUser]
    queryset = KVFile.objects.select_related("tenant").order_by("tenant__slug", "name")
    serializer_class = KVFileSerializer

    @extend_schema(request=None, responses=OpenApiTypes.OBJECT)
    @action(detail=True, methods=["post"])
    def evict(self, request, pk=None):
        kvfiles.staff_evict(self.get_object(), request.user)
        return Response({"evicted": True})
