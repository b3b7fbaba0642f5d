"""Thin DRF views: validate with serializers, call api/services, shape responses."""

from __future__ import annotations

from datetime import date

from django.conf import settings
from django.contrib.auth import authenticate, get_user_model, login, logout, update_session_auth_hash
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import transaction
from django.db.models import Count, Q
from django.http import HttpResponse
from django.middleware.csrf import get_token
from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, PermissionDenied, ValidationError
from rest_framework.permissions import AllowAny, IsAdminUser
from rest_framework.response import Response
from rest_framework.throttling import ScopedRateThrottle
from rest_framework.views import APIView

from api import serializers as s
from api.authentication import ApiKeyUser
from api.models import ApiKey, AuditLog, Invitation, KVFile, Membership, Program, Run, Tenant
from api.services import (
    accounts,
    auth_failures,
    billing,
    keys,
    kvfiles,
    mail,
    members,
    programs,
    quotas,
    routing,
    runs,
    tenant_closure,
)
from api.tenancy import SESSION_TENANT_KEY, IsTenantMember, TenantScopedViewSet, active_tenant


def _me(request) -> dict:
    """Who is signed in, their tenants and the active one (``None`` once they belong to none,
    e.g. removed from their only tenant: the console then offers to create one)."""
    user = request.user
    try:
        tenant = active_tenant(request)
    except PermissionDenied:
        tenant = None
    if isinstance(user, ApiKeyUser):
        return {
            "user": None,
            "tenants": [{"id": tenant.pk, "name": tenant.name, "slug": tenant.slug, "role": "api-key"}],
            "active_tenant": tenant.pk,
        }
    members = Membership.objects.filter(user=user).select_related("tenant").order_by("id")
    return {
        "user": {"id": user.pk, "email": user.email, "is_staff": user.is_staff},
        "tenants": [{"id": m.tenant.pk, "name": m.tenant.name, "slug": m.tenant.slug, "role": m.role} for m in members],
        "active_tenant": tenant.pk if tenant else None,
    }


def _console_user(request):
    """The signed-in console user; API keys are refused (they belong to a tenant, not a person)."""
    if isinstance(request.user, ApiKeyUser):
        raise PermissionDenied("API keys cannot manage accounts or teams: use the console")
    return request.user


class SignupView(APIView):
    permission_classes = [AllowAny]
    throttle_classes = [ScopedRateThrottle]
    throttle_scope = "auth"

    @extend_schema(request=s.SignupSerializer, responses=OpenApiTypes.OBJECT)
    @transaction.atomic
    def post(self, request):
        data = s.SignupSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        email = data.validated_data["email"].lower()
        users = get_user_model().objects
        invite = data.validated_data.get("invite")
        if invite:
            try:
                invited = members.find(invite)
            except members.InvitationInvalid as exc:
                raise ValidationError({"invite": str(exc)}) from exc
            if invited.email != email:
                raise ValidationError({"email": "this invitation is for another email address"})
        if users.filter(username=email).exists():
            return Response(
                {"error": {"code": "exists", "message": "email already registered", "detail": None}}, status=409
            )
        user = users.create_user(username=email, email=email, password=data.validated_data["password"])
        if invite:
            tenant = members.accept(user, invite).tenant
        else:
            tenant = members.create_tenant(user, data.validated_data["tenant_name"])
        login(request, user)
        request.session[SESSION_TENANT_KEY] = tenant.pk
        return Response(_me(request), status=status.HTTP_201_CREATED)


class LoginView(APIView):
    permission_classes = [AllowAny]
    throttle_classes = [ScopedRateThrottle]
    throttle_scope = "auth"

    @extend_schema(request=s.LoginSerializer, responses=OpenApiTypes.OBJECT)
    def post(self, request):
        data = s.LoginSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        user = authenticate(
            request, username=data.validated_data["email"].lower(), password=data.validated_data["password"]
        )
        if user is None:
            auth_failures.record("bad_login")
            return Response(
                {"error": {"code": "invalid_credentials", "message": "wrong email or password", "detail": None}},
                status=401,
            )
        login(request, user)
        return Response(_me(request))


class LogoutView(APIView):
    @extend_schema(request=None, responses=OpenApiTypes.OBJECT)
    def post(self, request):
        logout(request)
        return Response(status=status.HTTP_204_NO_CONTENT)


class MeView(APIView):
    @extend_schema(request=None, responses=OpenApiTypes.OBJECT)
    def get(self, request):
        return Response(_me(request))


class SwitchTenantView(APIView):
    @extend_schema(request=s.SwitchTenantSerializer, responses=OpenApiTypes.OBJECT)
    def post(self, request):
        user = _console_user(request)  # an API key is bound to its one tenant
        data = s.SwitchTenantSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        membership = get_object_or_404(Membership, user=user, tenant_id=data.validated_data["tenant"])
        request.session[SESSION_TENANT_KEY] = membership.tenant_id
        return Response(_me(request))


class PasswordChangeView(APIView):
    """Change the signed-in user's password; this session stays signed in, others end."""

    throttle_classes = [ScopedRateThrottle]
    throttle_scope = "auth"

    @extend_schema(request=s.PasswordChangeSerializer, responses={204: None})
    def post(self, request):
        user = _console_user(request)
        data = s.PasswordChangeSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        if not user.check_password(data.validated_data["current_password"]):
            raise ValidationError({"current_password": "wrong password"})
        user.set_password(data.validated_data["new_password"])
        user.save(update_fields=["password"])
        update_session_auth_hash(request, user)
        mail.queue_password_changed(user)
        return Response(status=status.HTTP_204_NO_CONTENT)


class LinkCredentialView(APIView):
    """Base of the routes a mailed link drives (password reset, email change): no session or key
    is read, so none is needed and no CSRF token either; the email or the link's token is the
    whole request. Throttled per client like sign-in."""

    permission_classes = [AllowAny]
    authentication_classes: list = []
    throttle_classes = [ScopedRateThrottle]
    throttle_scope = "auth"


class EmailChangeView(APIView):
    """Ask to sign in with another email address: a link is mailed to it, and the address changes
    only when that link is opened (api/services/accounts.py). Console only."""

    throttle_classes = [ScopedRateThrottle]
    throttle_scope = "auth"

    @extend_schema(request=s.EmailChangeSerializer, responses={202: OpenApiTypes.OBJECT})
    def post(self, request):
        user = _console_user(request)
        data = s.EmailChangeSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        try:
            new_email = accounts.request_email_change(
                user, data.validated_data["new_email"], data.validated_data["current_password"]
            )
        except accounts.WrongPassword as exc:
            raise ValidationError({"current_password": ["wrong password"]}) from exc
        message = f"a link to confirm {new_email} is on its way to that address"
        return Response({"detail": message}, status=status.HTTP_202_ACCEPTED)


class EmailChangeConfirmView(LinkCredentialView):
    """Open an email-change link: the account signs in with the new address from now on, and the
    old address is told. The token is the credential, so no session is needed (the link may be
    opened on another device)."""

    @extend_schema(request=s.EmailChangeConfirmSerializer, responses={200: OpenApiTypes.OBJECT})
    def post(self, request):
        data = s.EmailChangeConfirmSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        try:
            user = accounts.confirm_email_change(data.validated_data["token"])
        except accounts.EmailChangeLinkInvalid as exc:
            raise ValidationError({"token": [str(exc)]}) from exc
        return Response({"email": user.email})


class PasswordResetRequestView(LinkCredentialView):
    """Mail a one-time link to reset the password of the account using this email.

    Always 202, whether or not such an account exists (no account enumeration), and at most one
    mail per address a minute."""

    @extend_schema(request=s.PasswordResetRequestSerializer, responses={202: OpenApiTypes.OBJECT})
    def post(self, request):
        data = s.PasswordResetRequestSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        mail.request_password_reset(data.validated_data["email"])
        message = "if an account uses this email, a link to reset its password is on its way"
        body = {"detail": message, "valid_minutes": settings.PASSWORD_RESET_TIMEOUT // 60}
        return Response(body, status=status.HTTP_202_ACCEPTED)


class PasswordResetConfirmView(LinkCredentialView):
    """Set a new password through a reset link. Every session of the account ends (the link's
    own browser signs in afresh); API keys are the tenant's and stay."""

    @extend_schema(request=s.PasswordResetConfirmSerializer, responses={204: None})
    def post(self, request):
        data = s.PasswordResetConfirmSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        try:
            user = accounts.reset_password(
                data.validated_data["uid"], data.validated_data["token"], data.validated_data["new_password"]
            )
        except accounts.ResetLinkInvalid as exc:
            auth_failures.record("bad_reset_link")
            raise ValidationError({"token": [str(exc)]}) from exc
        except DjangoValidationError as exc:
            raise ValidationError({"new_password": list(exc.messages)}) from exc
        mail.queue_password_changed(user)
        return Response(status=status.HTTP_204_NO_CONTENT)


class TenantCreateView(APIView):
    """A new tenant owned by the signed-in user, who is switched to it."""

    @extend_schema(request=s.TenantCreateSerializer, responses={201: OpenApiTypes.OBJECT})
    def post(self, request):
        user = _console_user(request)
        data = s.TenantCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        tenant = members.create_tenant(user, data.validated_data["name"])
        request.session[SESSION_TENANT_KEY] = tenant.pk
        return Response(_me(request), status=status.HTTP_201_CREATED)


class TenantCloseView(APIView):
    """An owner closes a tenant: it stops at once (keys, runs, members) and its programs, runs
    and KV files are deleted in the background (api/services/tenant_closure.py)."""

    @extend_schema(request=s.TenantCloseSerializer, responses=OpenApiTypes.OBJECT)
    def post(self, request, tenant_id: int):
        user = _console_user(request)  # never an API key, even an owner's
        data = s.TenantCloseSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        membership = get_object_or_404(Membership.objects.select_related("tenant"), user=user, tenant_id=tenant_id)
        try:
            tenant_closure.close(user, membership.tenant, data.validated_data["confirm"])
        except tenant_closure.ConfirmationMismatch as exc:
            raise ValidationError({"confirm": [str(exc)]}) from exc
        if request.session.get(SESSION_TENANT_KEY) == tenant_id:
            del request.session[SESSION_TENANT_KEY]
        return Response(_me(request))


class InvitationPreviewView(APIView):
    """What an invite link offers, readable before signing in (the token is the credential)."""

    permission_classes = [AllowAny]
    throttle_classes = [ScopedRateThrottle]
    throttle_scope = "auth"

    @extend_schema(request=None, responses=s.InvitationPreviewSerializer)
    def get(self, request, token: str):
        return Response(s.InvitationPreviewSerializer(members.find(token)).data)


class InvitationAcceptView(APIView):
    """Join the invitation's tenant as the signed-in user and make it the active tenant."""

    throttle_classes = [ScopedRateThrottle]
    throttle_scope = "auth"

    @extend_schema(request=None, responses=OpenApiTypes.OBJECT)
    def post(self, request, token: str):
        membership = members.accept(_console_user(request), token)
        request.session[SESSION_TENANT_KEY] = membership.tenant_id
        return Response(_me(request))


class CsrfView(APIView):
    permission_classes = [AllowAny]

    @extend_schema(request=None, responses=OpenApiTypes.OBJECT)
    def get(self, request):
        return Response({"csrftoken": get_token(request)})


class ApiKeyViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    queryset = ApiKey.objects.order_by("-created_at")
    serializer_class = s.ApiKeySerializer

    def create(self, request):
        data = s.ApiKeySerializer(data=request.data)
        data.is_valid(raise_exception=True)
        creator = None if isinstance(request.user, ApiKeyUser) else request.user
        issued = keys.issue_key(
            self.tenant,
            data.validated_data["name"],
            data.validated_data["scopes"],
            creator,
            data.validated_data.get("expires_at"),
        )
        body = {**s.ApiKeySerializer(issued.key).data, "secret": issued.secret}
        return Response(body, status=status.HTTP_201_CREATED)

    def destroy(self, request, pk=None):
        keys.revoke_key(self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


class MemberViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    """The active tenant's members. Owners change roles and remove members; anyone may leave."""

    queryset = Membership.objects.select_related("user", "tenant").order_by("joined_at", "id")
    serializer_class = s.MemberSerializer

    @extend_schema(request=s.MemberRoleSerializer, responses=s.MemberSerializer)
    def partial_update(self, request, pk=None):
        data = s.MemberRoleSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        membership = members.change_role(_console_user(request), self.get_object(), data.validated_data["role"])
        return Response(s.MemberSerializer(membership).data)

    def destroy(self, request, pk=None):
        members.remove(_console_user(request), self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


class InvitationViewSet(mixins.ListModelMixin, TenantScopedViewSet):
    """Pending invitations of the active tenant; owners create (token shown once) and revoke."""

    queryset = Invitation.objects.select_related("invited_by", "tenant")
    serializer_class = s.InvitationSerializer

    def get_queryset(self):
        return members.pending(self.tenant).select_related("invited_by", "tenant")

    @extend_schema(request=s.InvitationSerializer, responses={201: s.NewInvitationSerializer})
    def create(self, request):
        data = s.InvitationSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        issued = members.invite(
            _console_user(request), self.tenant, data.validated_data["email"], data.validated_data["role"]
        )
        emailed = mail.queue_invitation(issued.invitation, issued.token)
        body = {**s.InvitationSerializer(issued.invitation).data, "token": issued.token, "emailed": emailed}
        return Response(body, status=status.HTTP_201_CREATED)

    def destroy(self, request, pk=None):
        members.revoke(_console_user(request), self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


class AuditLogViewSet(mixins.ListModelMixin, TenantScopedViewSet):
    """Owners: what happened to the tenant (team changes, operator KV evictions), newest first."""

    queryset = AuditLog.objects.select_related("actor").order_by("-created_at", "-id")
    serializer_class = s.AuditLogSerializer

    def list(self, request, *args, **kwargs):
        members.require_owner(_console_user(request), self.tenant)
        return super().list(request, *args, **kwargs)


class ProgramViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.DestroyModelMixin, TenantScopedViewSet):
    queryset = Program.objects.order_by("-created_at")
    serializer_class = s.ProgramSerializer
    required_scope = "programs"

    def perform_destroy(self, instance: Program) -> None:
        programs.delete_program(instance)  # with its finished runs; 409 while any is not

    @transaction.atomic
    def create(self, request):
        data = s.ProgramSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        upload = data.validated_data.pop("file")
        if Program.objects.filter(tenant=self.tenant, name=data.validated_data["name"]).exists():
            return Response(
                {"error": {"code": "exists", "message": "a program with this name exists", "detail": None}}, status=409
            )
        program = Program.objects.create(tenant=self.tenant, **data.validated_data)
        programs.add_version(program, upload.name, upload.read())
        return Response(s.ProgramSerializer(program).data, status=status.HTTP_201_CREATED)

    @action(detail=True, methods=["get", "post"])
    def versions(self, request, pk=None):
        program = self.get_object()
        if request.method == "POST":
            data = s.VersionUploadSerializer(data=request.data)
            data.is_valid(raise_exception=True)
            upload = data.validated_data["file"]
            version = programs.add_version(program, upload.name, upload.read())
            return Response(s.ProgramVersionSerializer(version).data, status=status.HTTP_201_CREATED)
        return Response(s.ProgramVersionSerializer(program.versions.order_by("number"), many=True).data)

    @action(detail=True, methods=["get"], url_path=r"versions/(?P<number>\d+)/source")
    def source(self, request, pk=None, number=None):
        version = get_object_or_404(self.get_object().versions, number=number)
        content_type = "application/zip" if version.kind == "zip" else "text/x-python; charset=utf-8"
        return HttpResponse(bytes(version.content), content_type=content_type)


@extend_schema_view(
    list=extend_schema(parameters=[s.RunFilterSerializer]),
    create=extend_schema(
        request=s.RunCreateSerializer,
        parameters=[
            OpenApiParameter(
                "Idempotency-Key",
                str,
                OpenApiParameter.HEADER,
                description="Same key within a tenant returns the first run (200) instead of a new one (201).",
            )
        ],
        responses={201: s.RunSerializer, 200: s.RunSerializer},
    ),
)
class RunViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    queryset = Run.objects.select_related("program_version")
    serializer_class = s.RunSerializer
    required_scope = "runs"

    def get_queryset(self):
        qs = super().get_queryset()
        if self.action == "logs":
            return qs
        qs = qs.defer("stdout", "stderr")  # up to 2 x 64 KiB a run, served by `logs` only
        if self.action != "list":
            return qs
        filters = s.RunFilterSerializer(data=self.request.query_params)
        filters.is_valid(raise_exception=True)
        if status_filter := filters.validated_data.get("status"):
            qs = qs.filter(status=status_filter)
        if program := filters.validated_data.get("program"):
            qs = qs.filter(program_version__program_id=program)
        return qs

    def create(self, request):
        data = s.RunCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        header = request.headers.get("Idempotency-Key")
        idempotency = s.IdempotencyKeySerializer(data={} if header is None else {"key": header})
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
        )
        return Response(s.RunSerializer(run).data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        return Response(s.RunSerializer(runs.cancel_run(self.get_object())).data)

    @extend_schema(responses=s.RunLogsSerializer)
    @action(detail=True, methods=["get"])
    def logs(self, request, pk=None):
        """What the program printed: the tail of its stdout and stderr, once the run has ended."""
        return Response(s.RunLogsSerializer(self.get_object()).data)


class QuotaView(APIView):
    permission_classes = [IsTenantMember]
    required_scope = "usage"

    @extend_schema(request=None, responses=OpenApiTypes.OBJECT)
    def get(self, request):
        return Response(quotas.quota_view(active_tenant(request)))


class UsageView(APIView):
    permission_classes = [IsTenantMember]
    required_scope = "usage"

    @extend_schema(
        request=None,
        responses=OpenApiTypes.OBJECT,
        parameters=[
            OpenApiParameter("from", OpenApiTypes.DATE, description="first UTC day (inclusive)"),
            OpenApiParameter("to", OpenApiTypes.DATE, description="last UTC day (inclusive)"),
            OpenApiParameter(
                "group_by",
                OpenApiTypes.STR,
                enum=list(billing.GROUPINGS),
                description="also sum the range per program or per API key (`groups`)",
            ),
        ],
    )
    def get(self, request):
        try:
            start = date.fromisoformat(request.query_params["from"]) if "from" in request.query_params else None
            end = date.fromisoformat(request.query_params["to"]) if "to" in request.query_params else None
        except ValueError as exc:
            raise ValidationError({"from/to": "dates must be YYYY-MM-DD"}) from exc
        tenant = active_tenant(request)
        body: dict = {"days": billing.usage_by_day(tenant, start, end)}
        group_by = request.query_params.get("group_by")
        if group_by is not None:
            if group_by not in billing.GROUPINGS:
                raise ValidationError({"group_by": f"one of {', '.join(billing.GROUPINGS)}"})
            body["groups"] = billing.usage_by_group(tenant, group_by, start, end)
        return Response(body)


class StaffWorkersView(APIView):
    """Staff only: every worker with a live heartbeat, as its ``health`` op reports itself
    (pages, sessions, batch occupancy, queue depth, forward time)."""

    permission_classes = [IsAdminUser]

    @extend_schema(request=None, responses=OpenApiTypes.OBJECT)
    def get(self, request):
        return Response(sorted((w.health for w in routing.live_workers()), key=lambda h: str(h.get("name"))))


class StaffTenantsView(APIView):
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


class InvoiceListView(APIView):
    permission_classes = [IsTenantMember]
    required_scope = "usage"

    @extend_schema(operation_id="invoices_list", request=None, responses=OpenApiTypes.OBJECT)
    def get(self, request):
        tenant = active_tenant(request)
        return Response([billing.invoice(tenant, month) for month in billing.invoice_months(tenant)])


class InvoiceDetailView(APIView):
    permission_classes = [IsTenantMember]
    required_scope = "usage"

    @extend_schema(operation_id="invoices_retrieve", request=None, responses=OpenApiTypes.OBJECT)
    def get(self, request, month: str):
        try:
            return Response(billing.invoice(active_tenant(request), month))
        except ValueError as exc:  # the URL admits months outside datetime.date (0000-01, 9999-12)
            raise NotFound(f"no invoice for month {month}") from exc


class KVFileViewSet(mixins.RetrieveModelMixin, TenantScopedViewSet):
    """The tenant's KV files. Listing refreshes the mirror from the worker first; when the worker
    cannot be reached the last mirror is returned with ``X-Symphony-Stale: 1``."""

    queryset = KVFile.objects.select_related("tenant").order_by("name")
    serializer_class = s.KVFileSerializer
    required_scope = "kv"

    def list(self, request):
        stale = False
        try:
            kvfiles.sync(self.tenant)
        except kvfiles.WorkerUnavailable:
            stale = True
        page = self.paginate_queryset(self.get_queryset())
        response = self.get_paginated_response(self.get_serializer(page, many=True).data)
        if stale:
            response["X-Symphony-Stale"] = "1"
        return response

    def destroy(self, request, pk=None):
        kvfiles.delete(self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=s.PinSerializer, responses=s.KVFileSerializer)
    @action(detail=True, methods=["post"])
    def pin(self, request, pk=None):
        kv = self.get_object()
        data = s.PinSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        return Response(s.KVFileSerializer(kvfiles.pin(kv, data.validated_data["pinned"])).data)


class StaffKVFileViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """Staff: every tenant's mirrored KV files, and audited eviction."""

    permission_classes = [IsAdminUser]
    queryset = KVFile.objects.select_related("tenant").order_by("tenant__slug", "name")
    serializer_class = s.KVFileSerializer

    @extend_schema(request=None, responses=OpenApiTypes.OBJECT)
    @action(detail=True, methods=["post"])
    def evict(self, request, pk=None):
        kvfiles.staff_evict(self.get_object(), request.user)
        return Response({"evicted": True})
