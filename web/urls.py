"""Top-level URL map: admin, API (v1), OpenAPI schema and docs, health, and the web console."""

import sys

from django.conf import settings
from django.contrib import admin
from django.db import InterfaceError, OperationalError
from django.http import HttpResponse, JsonResponse
from django.urls import include, path, re_path
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from django.views.defaults import bad_request as django_bad_request
from django.views.defaults import page_not_found
from django.views.defaults import server_error as django_server_error
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from api.services import server_errors


@never_cache
def console(request, route: str = ""):
    """The React console's index.html for ``/`` and every client-side route (frontend/dist)."""
    index = settings.FRONTEND_DIST / "index.html"
    if not index.is_file():
        return HttpResponse("Console not built: run `make frontend`.\n", status=503, content_type="text/plain")
    return HttpResponse(index.read_bytes(), content_type="text/html; charset=utf-8")


def _api_error(
    request,
    status: int,
    rest: tuple[str, str],
    openai: tuple[str, str, str],
    headers: dict | None = None,
    request_id: str | None = None,
) -> JsonResponse | None:
    """The error in the envelope of the front door the request came through: the REST API's
    (``rest``: code, message) under /api/, OpenAI's (``openai``: message, type, code) under
    /v1/; ``None`` elsewhere, where Django's own page answers. A server error carries the
    ``request_id`` its cause was logged under."""
    if request.path.startswith("/api/"):
        code, message = rest
        error = {"code": code, "message": message, "detail": None}
        if request_id is not None:
            error["request_id"] = request_id
        return JsonResponse({"error": error}, status=status, headers=headers)
    if request.path.startswith("/v1/"):
        from api.services.openai_requests import error_body

        return JsonResponse(error_body(*openai, request_id=request_id), status=status, headers=headers)
    return None


def not_found(request, exception=None):
    """404 for a URL no route matches. API clients get the API's error shape (the REST API's
    envelope under /api/, OpenAI's under /v1/) instead of Django's HTML page."""
    path = request.path
    rest, openai = ("not_found", f"no API route {path}"), (f"no route {path}", "invalid_request_error", "not_found")
    return _api_error(request, 404, rest, openai) or page_not_found(request, exception)


def bad_request(request, exception=None):
    """400 for a request Django refuses before any view runs (``SuspiciousOperation``: a form
    with more fields than ``DATA_UPLOAD_MAX_NUMBER_FIELDS``, a malformed multipart body). API
    clients get the API's error shape instead of Django's HTML page, with what was wrong."""
    message = str(exception) if exception is not None and str(exception) else "the request could not be read"
    rest, openai = ("invalid", message), (message, "invalid_request_error", "invalid_request")
    return _api_error(request, 400, rest, openai) or django_bad_request(request, exception)


def server_error(request, exception: BaseException | None = None):
    """500 for an exception nothing else handled; API clients get the API's error shape. A
    database that cannot be reached (down, restarting, or the web process's connection pool
    exhausted past ``DATABASE_POOL_TIMEOUT_S``) is a 503 with ``Retry-After``: nothing was
    done, and the same request may succeed in a moment. Django calls this while handling the
    exception, so ``sys.exc_info()`` is that exception; ``exception``: the exception when the
    caller is not inside its handler (web/api_errors.py)."""
    exc_info = (type(exception), exception, exception.__traceback__) if exception is not None else sys.exc_info()
    unavailable = isinstance(exc_info[1], (OperationalError, InterfaceError))
    status, headers = (503, {"Retry-After": "1"}) if unavailable else (500, None)
    message = "the database is unavailable; retry shortly" if unavailable else "internal error"
    code = "database_unavailable" if unavailable else "server_error"
    # The body names no cause (exception text carries server paths); the log has it, traceback
    # and all, under the id the body carries.
    request_id = server_errors.record(code, f"{request.method} {request.path}", exc_info=exc_info)
    return _api_error(
        request, status, (code, message), (message, "server_error", code), headers, request_id=request_id
    ) or (django_server_error(request))


@csrf_exempt  # it changes nothing; a POST to an unknown path is a 404, not a CSRF refusal
def no_api_route(request, rest: str = ""):
    """The API's 404 for a path under /api/ no route matched. Django's ``handler404`` says the
    same, but only with ``DJANGO_DEBUG`` off: on the local stack (debug on) an unknown API path
    got Django's HTML page listing every route."""
    return not_found(request)


handler404 = not_found
handler400 = bad_request
handler500 = server_error

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", include("api.urls")),
    path("v1/", include("api.openai_urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    # The split view serves Swagger UI's start-up script as a file: no inline script (web/csp.py).
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="swagger-ui"),
    re_path(r"^api/(?P<rest>.*)$", no_api_route, name="api-not-found"),
    re_path(r"^(?!api/|v1/|admin/?$|admin/|static/|metrics$)(?P<route>.*)$", console, name="console"),
]
