"""One error shape for every API response: ``{"error": {"code", "message", "detail"}}``."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.db.models import ProtectedError
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.exceptions import APIException
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_handler

from api.services import server_errors
from api.services.accounts import EmailTaken, EmailUnverified
from api.services.kvfiles import WorkerUnavailable
from api.services.mail import MailUnavailable
from api.services.members import InvitationInvalid, MembershipConflict, NotAllowed, TooManyTenants
from api.services.programs import ProgramInvalid
from api.services.quotas import PlanQuotaExceeded
from api.services.runs import IdempotencyMismatch, RunConflict
from api.services.tenant_closure import TenantClosed
from api.services.tool_hosts import ToolHostsInvalid

DOMAIN_ERRORS = {
    ProgramInvalid: (status.HTTP_400_BAD_REQUEST, "invalid_program"),
    PlanQuotaExceeded: (status.HTTP_429_TOO_MANY_REQUESTS, "quota_exceeded"),
    RunConflict: (status.HTTP_409_CONFLICT, "conflict"),
    IdempotencyMismatch: (status.HTTP_422_UNPROCESSABLE_ENTITY, "idempotency_mismatch"),
    ProtectedError: (status.HTTP_409_CONFLICT, "conflict"),
    WorkerUnavailable: (status.HTTP_503_SERVICE_UNAVAILABLE, "worker_unavailable"),
    MembershipConflict: (status.HTTP_409_CONFLICT, "conflict"),
    NotAllowed: (status.HTTP_403_FORBIDDEN, "permission_denied"),
    InvitationInvalid: (status.HTTP_404_NOT_FOUND, "not_found"),
    TooManyTenants: (status.HTTP_429_TOO_MANY_REQUESTS, "quota_exceeded"),
    TenantClosed: (status.HTTP_409_CONFLICT, "conflict"),
    MailUnavailable: (status.HTTP_503_SERVICE_UNAVAILABLE, "mail_unavailable"),
    EmailTaken: (status.HTTP_409_CONFLICT, "exists"),
    EmailUnverified: (status.HTTP_403_FORBIDDEN, "email_unverified"),
    ToolHostsInvalid: (status.HTTP_400_BAD_REQUEST, "invalid"),
}


#: What the client of a 5xx domain error is told; the exception's own text (a worker's socket
#: error names server paths) is logged under the request id the body carries.
SERVER_ERROR_MESSAGES = {
    WorkerUnavailable: "the GPU worker is unavailable; retry shortly",
    MailUnavailable: "mail cannot be sent right now; try again in a minute",
}


def exception_handler(exc: Exception, context: dict) -> Response | None:
    for cls, (code_status, code) in DOMAIN_ERRORS.items():
        if isinstance(exc, cls):
            if code_status >= 500:
                return _server_error(exc, code_status, code)
            message = "still referenced by runs" if isinstance(exc, ProtectedError) else str(exc)
            return Response({"error": {"code": code, "message": message, "detail": None}}, status=code_status)
    # Django's own 404/403 (get_object_or_404, get_object) become DRF's, as DRF's handler does
    # internally, so they carry the documented codes `not_found` / `permission_denied`.
    if isinstance(exc, Http404):
        exc = exceptions.NotFound(*exc.args)
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied(*exc.args)
    response = drf_handler(exc, context)
    if response is None:
        return None
    code = exc.get_codes() if isinstance(exc, APIException) else "error"
    if not isinstance(code, str):
        code = "invalid" if response.status_code == 400 else "error"
    detail = response.data
    message = detail.get("detail", "request failed") if isinstance(detail, dict) else "request failed"
    response.data = {"error": {"code": code, "message": str(message), "detail": detail}}
    return response


def _server_error(exc: Exception, code_status: int, code: str) -> Response:
    request_id = server_errors.record(code, f"{type(exc).__name__}: {exc}", exc_info=exc)
    message = next((m for cls, m in SERVER_ERROR_MESSAGES.items() if isinstance(exc, cls)), "internal error")
    body = {"error": {"code": code, "message": message, "detail": None, "request_id": request_id}}
    return Response(body, status=code_status, headers={"Retry-After": "1"} if code_status == 503 else None)
