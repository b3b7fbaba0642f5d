"""Sign-up, sign-in, the session's identity and tenant, password and email changes."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth import authenticate, get_user_model, login, logout, update_session_auth_hash
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import transaction
from django.middleware.csrf import get_token
from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.exceptions import Throttled, ValidationError
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.throttling import ScopedRateThrottle
from rest_framework.views import APIView

from api.csrf import CsrfTokenRequired
from api.models import Membership
from api.serializers.auth import (
    EmailChangeConfirmSerializer,
    EmailChangeSerializer,
    LoginSerializer,
    PasswordChangeSerializer,
    PasswordResetConfirmSerializer,
    PasswordResetRequestSerializer,
    SignupSerializer,
    SwitchTenantSerializer,
    VerifyEmailSerializer,
)
from api.services import accounts, auth_failures, login_lockout, mail, members
from api.tenancy import SESSION_TENANT_KEY
from api.views._shared import _console_user, _me


class SignupView(APIView):
    permission_classes = [AllowAny, CsrfTokenRequired]
    throttle_classes = [ScopedRateThrottle]
    throttle_scope = "auth"

    @extend_schema(request=SignupSerializer, responses=OpenApiTypes.OBJECT)
    @transaction.atomic
    def post(self, request):
        data = SignupSerializer(data=request.data)
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
        if invite:  # the invitation mail reached this address: it is verified
            tenant = members.accept(user, invite).tenant
        else:
            tenant = members.create_tenant(user, data.validated_data["tenant_name"])
            accounts.start_verification(user)
        login(request, user)
        request.session[SESSION_TENANT_KEY] = tenant.pk
        return Response(_me(request), status=status.HTTP_201_CREATED)


class AccountLockedError(Throttled):
    """429 ``account_locked`` with Retry-After (api/services/login_lockout.py)."""

    default_code = "account_locked"


class LoginView(APIView):
    permission_classes = [AllowAny, CsrfTokenRequired]
    throttle_classes = [ScopedRateThrottle]
    throttle_scope = "auth"

    @extend_schema(request=LoginSerializer, responses=OpenApiTypes.OBJECT)
    def post(self, request):
        data = LoginSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        account = data.validated_data["email"]  # the username it resolves to (LoginSerializer)
        try:
            login_lockout.check(account)  # before the password is looked at: locked tells nothing
            user = authenticate(request, username=account, password=data.validated_data["password"])
            if user is None:
                auth_failures.record("bad_login")
                login_lockout.record_failure(account)
        except login_lockout.AccountLocked as locked:
            raise AccountLockedError(wait=locked.retry_after, detail=locked.message) from None
        if user is None:
            return Response(
                {
                    "error": {
                        "code": "invalid_credentials",
                        "message": "wrong email, username or password",
                        "detail": None,
                    }
                },
                status=401,
            )
        login_lockout.clear(account)
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
    @extend_schema(request=SwitchTenantSerializer, responses=OpenApiTypes.OBJECT)
    def post(self, request):
        user = _console_user(request)  # an API key is bound to its one tenant
        data = SwitchTenantSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        membership = get_object_or_404(Membership, user=user, tenant_id=data.validated_data["tenant"])
        request.session[SESSION_TENANT_KEY] = membership.tenant_id
        return Response(_me(request))


class PasswordChangeView(APIView):
    """Change the signed-in user's password; this session stays signed in, others end."""

    throttle_classes = [ScopedRateThrottle]
    throttle_scope = "auth"

    @extend_schema(request=PasswordChangeSerializer, responses={204: None})
    def post(self, request):
        user = _console_user(request)
        data = PasswordChangeSerializer(data=request.data)
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

    @extend_schema(request=EmailChangeSerializer, responses={202: OpenApiTypes.OBJECT})
    def post(self, request):
        user = _console_user(request)
        data = EmailChangeSerializer(data=request.data)
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

    @extend_schema(request=EmailChangeConfirmSerializer, responses={200: OpenApiTypes.OBJECT})
    def post(self, request):
        data = EmailChangeConfirmSerializer(data=request.data)
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

    @extend_schema(request=PasswordResetRequestSerializer, responses={202: OpenApiTypes.OBJECT})
    def post(self, request):
        data = PasswordResetRequestSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        mail.request_password_reset(data.validated_data["email"])
        message = "if an account uses this email, a link to reset its password is on its way"
        body = {"detail": message, "valid_minutes": settings.PASSWORD_RESET_TIMEOUT // 60}
        return Response(body, status=status.HTTP_202_ACCEPTED)


class PasswordResetConfirmView(LinkCredentialView):
    """Set a new password through a reset link. Every session of the account ends (the link's
    own browser signs in afresh), and every API key the account minted before it is revoked
    unless the body says ``"revoke_api_keys": false``; the address counts as verified and the
    account's sign-in lockout ends (api/services/accounts.py)."""

    @extend_schema(request=PasswordResetConfirmSerializer, responses={204: None})
    def post(self, request):
        data = PasswordResetConfirmSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        try:
            user = accounts.reset_password(
                data.validated_data["uid"],
                data.validated_data["token"],
                data.validated_data["new_password"],
                revoke_api_keys=data.validated_data["revoke_api_keys"],
            )
        except accounts.ResetLinkInvalid as exc:
            auth_failures.record("bad_reset_link")
            raise ValidationError({"token": [str(exc)]}) from exc
        except DjangoValidationError as exc:
            raise ValidationError({"new_password": list(exc.messages)}) from exc
        mail.queue_password_changed(user)
        return Response(status=status.HTTP_204_NO_CONTENT)


class VerifyEmailView(LinkCredentialView):
    """Open the link mailed at sign-up: the account's address is verified, and it may mint API
    keys, upload programs and start runs. The token is the credential (the link may be opened on
    another device), so no session is needed."""

    @extend_schema(request=VerifyEmailSerializer, responses={200: OpenApiTypes.OBJECT})
    def post(self, request):
        data = VerifyEmailSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        try:
            user = accounts.verify_email(data.validated_data["token"])
        except accounts.VerifyLinkInvalid as exc:
            raise ValidationError({"token": [str(exc)]}) from exc
        return Response({"email": user.email, "email_verified": True})


class VerifyEmailResendView(APIView):
    """Mail the signed-in user's verification link again: at most one mail a minute per account
    (and the per-client ``auth`` throttle). 202 either way; ``sent`` says whether one went."""

    throttle_classes = [ScopedRateThrottle]
    throttle_scope = "auth"

    @extend_schema(request=None, responses={202: OpenApiTypes.OBJECT})
    def post(self, request):
        user = _console_user(request)
        if accounts.is_verified(user):
            body = {"detail": f"{user.email} is already verified", "sent": False, "email_verified": True}
            return Response(body, status=status.HTTP_202_ACCEPTED)
        sent = accounts.resend_verification(user)
        message = (
            f"a new verification link is on its way to {user.email}"
            if sent
            else f"a verification link went to {user.email} less than a minute ago: check your inbox"
        )
        return Response({"detail": message, "sent": sent, "email_verified": False}, status=status.HTTP_202_ACCEPTED)


class CsrfView(APIView):
    permission_classes = [AllowAny]

    @extend_schema(request=None, responses=OpenApiTypes.OBJECT)
    def get(self, request):
        return Response({"csrftoken": get_token(request)})
