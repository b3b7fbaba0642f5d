"""The API's error envelope for a view's exception, whatever ``DJANGO_DEBUG`` says.

With debug off, Django answers an exception a view raised through ``handler404`` /
``handler400`` / ``handler500`` (web/urls.py), which give API clients the API's envelope. With
debug on (the local stack `make up` runs) it answers with its technical HTML pages instead: a
traceback, server paths and settings for an unhandled error. A client of the API gets neither
from any stack: under /api/ and /v1/ this middleware answers the exception as those handlers
would. Elsewhere (the console, the admin) Django's own pages stay.
"""

from __future__ import annotations

from django.core.exceptions import BadRequest, SuspiciousOperation
from django.http import Http404, HttpRequest, HttpResponse
from django.utils.deprecation import MiddlewareMixin

API_PREFIXES = ("/api/", "/v1/")


class ApiErrorsMiddleware(MiddlewareMixin):
    """``process_exception`` for the API's paths (see the module docstring)."""

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not request.path.startswith(API_PREFIXES):
            return None
        # Here, not at the top: web.urls imports the views, which read this module's settings.
        from web import urls

        if isinstance(exception, Http404):
            return urls.not_found(request, exception)
        if isinstance(exception, SuspiciousOperation | BadRequest):
            return urls.bad_request(request, exception)
        return urls.server_error(request, exception)
