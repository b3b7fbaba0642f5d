"""Liveness/readiness probe: checks PostgreSQL and Redis over real connections."""

from __future__ import annotations

import redis
from django.conf import settings
from django.db import connection
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView


def check_dependencies() -> dict[str, str]:
    """Return ``{"database": "ok"|error, "redis": "ok"|error}``."""
    status: dict[str, str] = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        status["database"] = "ok"
    except Exception as exc:
        status["database"] = f"error: {exc.__class__.__name__}"
    try:
        with redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2) as client:  # closed: probes come every few s
            client.ping()
        status["redis"] = "ok"
    except Exception as exc:
        status["redis"] = f"error: {exc.__class__.__name__}"
    return status


def health_report() -> tuple[dict, int]:
    """The probe's body and HTTP status: 200 when every dependency answers, 503 otherwise."""
    checks = check_dependencies()
    healthy = all(value == "ok" for value in checks.values())
    return {"status": "ok" if healthy else "degraded", "checks": checks}, 200 if healthy else 503


class HealthProbeMiddleware:
    """Answers ``GET /api/v1/health`` before host validation and the HTTPS redirect.

    Load balancer probes address a task by IP over plain HTTP inside the VPC, so they carry a
    Host header that ``ALLOWED_HOSTS`` rightly rejects. The probe reveals only whether the
    database and Redis answer, so serving it to any host is safe. First in ``MIDDLEWARE``.
    """

    PATH = "/api/v1/health"

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request):
        if request.path != self.PATH or request.method not in ("GET", "HEAD"):
            return self.get_response(request)
        from django.http import JsonResponse

        body, status = health_report()
        return JsonResponse(body, status=status)


class HealthView(APIView):
    """``GET /api/v1/health``: 200 when every dependency answers, 503 otherwise."""

    permission_classes = [AllowAny]
    authentication_classes: list = []

    @extend_schema(
        responses=inline_serializer("Health", {"status": serializers.CharField(), "checks": serializers.DictField()})
    )
    def get(self, request: Request) -> Response:
        body, status = health_report()
        return Response(body, status=status)
