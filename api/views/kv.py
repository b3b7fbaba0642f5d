"""The tenant's KV files: list (mirrored from the worker), pin, delete."""

from __future__ import annotations

from django.db.models import Case, Value, When
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status
from rest_framework.decorators import action
from rest_framework.response import Response

from api.models import KVFile
from api.serializers.kv import KVFileSerializer, PinSerializer
from api.services import kvfiles
from api.tenancy import TenantScopedViewSet


class KVFileViewSet(mixins.RetrieveModelMixin, TenantScopedViewSet):
    """The tenant's KV files, paginated (``?limit=`` at most 500), one entry per name: a file
    several workers hold (all read it from the shared store) is listed once, as the worker that
    pins it or holds it closest to the device sees it, and its operations go to that worker
    (api/services/kvfiles.py). The first page refreshes the mirror from every worker, so the
    pages after it are of the same listing; when a worker cannot be reached the last mirror is
    returned with ``X-Symphony-Stale: 1``."""

    queryset = KVFile.objects.select_related("tenant").order_by("name")
    serializer_class = KVFileSerializer
    required_scope = "kv"

    def list(self, request):
        stale = False
        try:
            if self.paginator.get_offset(request) == 0:
                stale = bool(kvfiles.sync(self.tenant))
        except kvfiles.WorkerUnavailable:
            stale = True
        residency_rank = Case(
            When(residency="device", then=Value(0)), When(residency="host", then=Value(1)), default=Value(2)
        )
        listing = self.get_queryset().order_by("name", "-pinned", residency_rank, "worker").distinct("name")
        page = self.paginate_queryset(listing)
        response = self.get_paginated_response(self.get_serializer(page, many=True).data)
        if stale:
            response["X-Symphony-Stale"] = "1"
        return response

    def destroy(self, request, pk=None):
        kvfiles.delete(self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=PinSerializer, responses=KVFileSerializer)
    @action(detail=True, methods=["post"])
    def pin(self, request, pk=None):
        kv = self.get_object()
        data = PinSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        return Response(KVFileSerializer(kvfiles.pin(kv, data.validated_data["pinned"])).data)
