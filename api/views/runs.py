"""Runs: create (idempotent), list, cancel, logs. The event stream is api/views/run_events.py."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import mixins, status
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from api.models import ApiKey, Program, Run
from api.serializers.runs import (
    IdempotencyKeySerializer,
    RunCreateSerializer,
    RunFilterSerializer,
    RunLogsSerializer,
    RunSerializer,
)
from api.services import quotas, runs
from api.tenancy import TenantScopedViewSet
from api.views._shared import _verified_user


@extend_schema_view(
    list=extend_schema(parameters=[RunFilterSerializer]),
    create=extend_schema(
        request=RunCreateSerializer,
        parameters=[
            OpenApiParameter(
                "Idempotency-Key",
                str,
                OpenApiParameter.HEADER,
                description="Same key and body within a tenant returns the first run (200) instead of a new one"
                " (201); the same key with another body is a 422 idempotency_mismatch.",
            ),
            OpenApiParameter(
                "traceparent",
                str,
                OpenApiParameter.HEADER,
                description="W3C trace context of the caller's span: with OpenTelemetry export on, the run's span"
                " is its child. Kept only in the exact version-00 form; anything else is ignored.",
            ),
        ],
        responses={201: RunSerializer, 200: RunSerializer},
    ),
)
class RunViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    queryset = Run.objects.select_related("program_version__program")
    serializer_class = RunSerializer
    required_scope = "runs"

    def get_queryset(self):
        qs = super().get_queryset()
        if self.action == "logs":
            return qs
        qs = qs.defer("stdout", "stderr")  # up to 2 x 64 KiB a run, served by `logs` only
        if self.action != "list":
            return qs
        filters = RunFilterSerializer(data=self.request.query_params)
        filters.is_valid(raise_exception=True)
        if status_filter := filters.validated_data.get("status"):
            qs = qs.filter(status=status_filter)
        if program := filters.validated_data.get("program"):
            qs = qs.filter(program_version__program_id=program)
        if parent := filters.validated_data.get("parent"):
            qs = qs.filter(parent_id=parent)
        return qs

    def create(self, request):
        _verified_user(request)
        data = RunCreateSerializer(data=request.data, context={"plan": quotas.plan_limits(self.tenant)})
        data.is_valid(raise_exception=True)
        header = request.headers.get("Idempotency-Key")
        idempotency = IdempotencyKeySerializer(data={} if header is None else {"key": header})
        if not idempotency.is_valid():
            raise ValidationError({"Idempotency-Key": idempotency.errors["key"]})
        program = get_object_or_404(Program, pk=data.validated_data["program"], tenant=self.tenant)
        run, created = runs.create_run(
            self.tenant,
            program,
            data.validated_data.get("version"),
            data.validated_data["args"],
            data.validated_data["limits"],
            idempotency_key=idempotency.validated_data.get("key"),
            api_key=request.auth if isinstance(request.auth, ApiKey) else None,
            name=data.validated_data["name"],
            traceparent=request.headers.get("traceparent", ""),
        )
        return Response(RunSerializer(run).data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        key = request.auth if isinstance(request.auth, ApiKey) else None
        person = request.user if key is None and request.user.is_authenticated else None
        return Response(RunSerializer(runs.cancel_run(self.get_object(), actor=person, api_key=key)).data)

    @extend_schema(responses=RunLogsSerializer)
    @action(detail=True, methods=["get"])
    def logs(self, request, pk=None):
        """What the program printed: the tail of its stdout and stderr, once the run has ended."""
        return Response(RunLogsSerializer(self.get_object()).data)
