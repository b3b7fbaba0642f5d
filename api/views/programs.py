"""Programs and their uploaded versions."""

from __future__ import annotations

from django.db import transaction
from django.http import HttpResponse
from django.shortcuts import get_object_or_404
from rest_framework import mixins, status
from rest_framework.decorators import action
from rest_framework.response import Response

from api.models import Program
from api.serializers.programs import ProgramSerializer, ProgramVersionSerializer, VersionUploadSerializer
from api.services import programs
from api.tenancy import TenantScopedViewSet
from api.views._shared import _verified_user


class ProgramViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.DestroyModelMixin, TenantScopedViewSet):
    queryset = Program.objects.order_by("-created_at")
    serializer_class = ProgramSerializer
    required_scope = "programs"

    def perform_destroy(self, instance: Program) -> None:
        programs.delete_program(instance)  # with its finished runs; 409 while any is not

    @transaction.atomic
    def create(self, request):
        _verified_user(request)
        data = ProgramSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        upload = data.validated_data.pop("file")
        if Program.objects.filter(tenant=self.tenant, name=data.validated_data["name"]).exists():
            return Response(
                {"error": {"code": "exists", "message": "a program with this name exists", "detail": None}}, status=409
            )
        program = Program.objects.create(tenant=self.tenant, **data.validated_data)
        programs.add_version(program, upload.name, upload.read())
        return Response(ProgramSerializer(program).data, status=status.HTTP_201_CREATED)

    @action(detail=True, methods=["get", "post"])
    def versions(self, request, pk=None):
        program = self.get_object()
        if request.method == "POST":
            _verified_user(request)
            data = VersionUploadSerializer(data=request.data)
            data.is_valid(raise_exception=True)
            upload = data.validated_data["file"]
            version, created = programs.add_version_if_changed(program, upload.name, upload.read())
            code = status.HTTP_201_CREATED if created else status.HTTP_200_OK
            return Response(ProgramVersionSerializer(version).data, status=code)
        return Response(ProgramVersionSerializer(program.versions.order_by("number"), many=True).data)

    @action(detail=True, methods=["get"], url_path=r"versions/(?P<number>\d+)/source")
    def source(self, request, pk=None, number=None):
        version = get_object_or_404(self.get_object().versions, number=number)
        content_type = "application/zip" if version.kind == "zip" else "text/x-python; charset=utf-8"
        return HttpResponse(bytes(version.content), content_type=content_type)
