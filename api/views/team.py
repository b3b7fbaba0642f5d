"""Tenants and their people: create and close a tenant, members, invitations, audit log."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status
from rest_framework.exceptions import ValidationError
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.throttling import ScopedRateThrottle
from rest_framework.views import APIView

from api.models import AuditLog, Invitation, Membership
from api.serializers.team import (
    AuditLogSerializer,
    InvitationPreviewSerializer,
    InvitationSerializer,
    MemberRoleSerializer,
    MemberSerializer,
    NewInvitationSerializer,
    TenantCloseSerializer,
    TenantCreateSerializer,
)
from api.services import mail, members, tenant_closure
from api.tenancy import SESSION_TENANT_KEY, TenantScopedViewSet
from api.views._shared import _console_user, _me


class TenantCreateView(APIView):
    """A new tenant owned by the signed-in user, who is switched to it."""

    @extend_schema(request=TenantCreateSerializer, responses={201: OpenApiTypes.OBJECT})
    def post(self, request):
        user = _console_user(request)
        data = TenantCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        tenant = members.create_tenant(user, data.validated_data["name"])
        request.session[SESSION_TENANT_KEY] = tenant.pk
        return Response(_me(request), status=status.HTTP_201_CREATED)


class TenantCloseView(APIView):
    """An owner closes a tenant: it stops at once (keys, runs, members) and its programs, runs
    and KV files are deleted in the background (api/services/tenant_closure.py)."""

    @extend_schema(request=TenantCloseSerializer, responses=OpenApiTypes.OBJECT)
    def post(self, request, tenant_id: int):
        user = _console_user(request)  # never an API key, even an owner's
        data = TenantCloseSerializer(data=request.data)
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

    @extend_schema(request=None, responses=InvitationPreviewSerializer)
    def get(self, request, token: str):
        return Response(InvitationPreviewSerializer(members.find(token)).data)


class InvitationAcceptView(APIView):
    """Join the invitation's tenant as the signed-in user and make it the active tenant."""

    throttle_classes = [ScopedRateThrottle]
    throttle_scope = "auth"

    @extend_schema(request=None, responses=OpenApiTypes.OBJECT)
    def post(self, request, token: str):
        membership = members.accept(_console_user(request), token)
        request.session[SESSION_TENANT_KEY] = membership.tenant_id
        return Response(_me(request))


class MemberViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    """The active tenant's members. Owners change roles and remove members; anyone may leave."""

    queryset = Membership.objects.select_related("user", "tenant").order_by("joined_at", "id")
    serializer_class = MemberSerializer

    @extend_schema(request=MemberRoleSerializer, responses=MemberSerializer)
    def partial_update(self, request, pk=None):
        data = MemberRoleSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        membership = members.change_role(_console_user(request), self.get_object(), data.validated_data["role"])
        return Response(MemberSerializer(membership).data)

    def destroy(self, request, pk=None):
        members.remove(_console_user(request), self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


class InvitationViewSet(mixins.ListModelMixin, TenantScopedViewSet):
    """Pending invitations of the active tenant; owners create (token shown once) and revoke."""

    queryset = Invitation.objects.select_related("invited_by", "tenant")
    serializer_class = InvitationSerializer

    def get_queryset(self):
        return members.pending(self.tenant).select_related("invited_by", "tenant")

    @extend_schema(request=InvitationSerializer, responses={201: NewInvitationSerializer})
    def create(self, request):
        data = InvitationSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        issued = members.invite(
            _console_user(request), self.tenant, data.validated_data["email"], data.validated_data["role"]
        )
        emailed = mail.queue_invitation(issued.invitation, issued.token)
        body = {**InvitationSerializer(issued.invitation).data, "token": issued.token, "emailed": emailed}
        return Response(body, status=status.HTTP_201_CREATED)

    def destroy(self, request, pk=None):
        members.revoke(_console_user(request), self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


class AuditLogViewSet(mixins.ListModelMixin, TenantScopedViewSet):
    """Owners: what happened to the tenant (team changes, operator KV evictions), newest first."""

    queryset = AuditLog.objects.select_related("actor").order_by("-created_at", "-id")
    serializer_class = AuditLogSerializer

    def list(self, request, *args, **kwargs):
        members.require_owner(_console_user(request), self.tenant)
        return super().list(request, *args, **kwargs)
