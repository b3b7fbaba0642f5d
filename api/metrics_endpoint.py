"""``GET /metrics``: the service's Prometheus metrics (``api.services.metrics``) for scrapers.

Who may read them: with ``SYMPHONY_METRICS_TOKEN`` set, a request carrying
``Authorization: Bearer <token>`` (Prometheus' ``authorization`` setting); without it, only
requests from this host's loopback address, so a fresh install exposes nothing to the network.
The figures are operational (per worker and service-wide, never per tenant), but they still say
how busy the service is, which is not for the public.
"""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpResponse, JsonResponse

from api.services.metrics import exposition

LOOPBACK = ("127.0.0.1", "::1")


def _refusal(request) -> HttpResponse | None:
    """``None`` when the request may read the metrics, else the response that says why not."""
    token = settings.SYMPHONY_METRICS_TOKEN
    if token:
        if hmac.compare_digest(request.headers.get("Authorization", ""), f"Bearer {token}"):
            return None
        body = {"error": {"code": "authentication_failed", "message": "metrics need the bearer token", "detail": None}}
        response = JsonResponse(body, status=401)
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    if request.META.get("REMOTE_ADDR") in LOOPBACK:
        return None
    message = "metrics are served to loopback only; set SYMPHONY_METRICS_TOKEN to scrape from elsewhere"
    return JsonResponse({"error": {"code": "permission_denied", "message": message, "detail": None}}, status=403)


class MetricsEndpointMiddleware:
    """Answers ``GET /metrics`` before host validation and the HTTPS redirect, as the health
    probe does: scrapers address a task by IP over plain HTTP inside the VPC, with a Host
    header ``ALLOWED_HOSTS`` rejects. The token (or loopback) is what guards it."""

    PATH = "/metrics"

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request):
        if request.path != self.PATH:
            return self.get_response(request)
        if request.method not in ("GET", "HEAD"):
            body = {"error": {"code": "method_not_allowed", "message": "GET /metrics only", "detail": None}}
            response = JsonResponse(body, status=405)
            response["Allow"] = "GET, HEAD"
            return response
        refusal = _refusal(request)
        if refusal is not None:
            return refusal
        body, content_type = exposition()
        return HttpResponse(body, content_type=content_type)
