"""Content-Security-Policy for every response, one policy per kind of page.

The console (frontend/dist) is a Vite build: one module script and one stylesheet from
``/static/``, no inline script or style, API calls to its own origin. It gets the strict policy:
nothing but this origin, no inline code, no framing, no plugins. The pages Django renders from
templates (the admin, DRF's browsable API under ``/api/``) run no inline scripts either, but
carry ``style`` attributes and ``<style>`` blocks, so inline styles are allowed there. Swagger UI
(``/api/docs/``) loads its bundle and stylesheet from ``SWAGGER_UI_DIST`` (a CDN unless the
sidecar is used) and has one inline ``<style>``; its start-up script is served as a file
(web/urls.py uses the split view), so scripts stay limited to this origin and that one source.
JSON responses carry a policy too (a browser that renders one as a document runs nothing).

Every response means those answered before the rest of Django too: the health probe and
``/metrics`` answer from middleware ahead of host validation, so :func:`content_security_policy`
comes first in ``MIDDLEWARE`` (after them, ``/api/v1/health`` would answer with no policy);
and the refusals ``web/asgi.py`` sends in front of Django (413, 408, 429, 503) get theirs from
:class:`ContentSecurityPolicyASGI`, the outermost ASGI layer."""

from __future__ import annotations

from collections.abc import Callable
from inspect import iscoroutinefunction
from urllib.parse import urlsplit

from django.http import HttpRequest, HttpResponse
from django.utils.decorators import sync_and_async_middleware

from web.body_limit import ASGIApp, Message, Receive, Scope, Send

HEADER = "Content-Security-Policy"

_COMMON = {
    "default-src": "'self'",
    "img-src": "'self' data:",
    "object-src": "'none'",
    "base-uri": "'none'",
    "form-action": "'self'",
    "frame-ancestors": "'none'",
}


def _policy(**directives: str) -> str:
    merged = {**_COMMON, **{name.replace("_", "-"): value for name, value in directives.items()}}
    return "; ".join(f"{name} {value}" for name, value in merged.items())


def _swagger_origin() -> str:
    """Where Swagger UI's files come from: the CDN origin of ``SWAGGER_UI_DIST``, or nothing
    more than this origin when drf-spectacular serves them itself (``SIDECAR``)."""
    from drf_spectacular.settings import spectacular_settings

    parts = urlsplit(str(spectacular_settings.SWAGGER_UI_DIST))
    return f" {parts.scheme}://{parts.netloc}" if parts.scheme in ("https", "http") and parts.netloc else ""


CONSOLE = _policy(script_src="'self'", style_src="'self'", connect_src="'self'")
TEMPLATED = _policy(script_src="'self'", style_src="'self' 'unsafe-inline'", connect_src="'self'")


def swagger_policy() -> str:
    cdn = _swagger_origin()
    return _policy(
        script_src=f"'self'{cdn}",
        style_src=f"'self' 'unsafe-inline'{cdn}",
        img_src=f"'self' data:{cdn}",
        connect_src="'self'",
    )


def policy_for(path: str) -> str:
    """The policy of the page at ``path``."""
    if path.startswith("/api/docs/"):
        return swagger_policy()
    if path.startswith(("/admin/", "/api/")):
        return TEMPLATED
    return CONSOLE


@sync_and_async_middleware
def content_security_policy(get_response: Callable):
    """Set the path's policy on every response that has none of its own."""

    def add(request: HttpRequest, response: HttpResponse) -> HttpResponse:
        if HEADER not in response.headers:
            response.headers[HEADER] = policy_for(request.path)
        return response

    if iscoroutinefunction(get_response):

        async def async_middleware(request: HttpRequest) -> HttpResponse:
            return add(request, await get_response(request))

        return async_middleware

    def middleware(request: HttpRequest) -> HttpResponse:
        return add(request, get_response(request))

    return middleware


class ContentSecurityPolicyASGI:
    """ASGI middleware: the path's policy on every HTTP response that has none of its own,
    those the ASGI layers in front of Django answer included."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        policy = policy_for(scope.get("path", "")).encode("latin-1")

        async def send_with_policy(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                if not any(name.lower() == HEADER.lower().encode() for name, _ in headers):
                    message = {**message, "headers": [*headers, (HEADER.lower().encode(), policy)]}
            await send(message)

        await self.app(scope, receive, send_with_policy)
