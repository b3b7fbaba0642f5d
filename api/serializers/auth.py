"""Sign-up, sign-in, switching tenant, and a person's password and email (api/views/auth.py)."""

from __future__ import annotations

from django.contrib.auth import get_user_model, password_validation
from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import serializers

from api.services import accounts


class SignupSerializer(serializers.Serializer):
    """A new user and, unless they sign up through an invitation, a new tenant they own."""

    # The email is also the username, whose column holds 150 characters.
    email = serializers.EmailField(max_length=150)
    password = serializers.CharField(min_length=8, write_only=True)
    tenant_name = serializers.CharField(max_length=200, required=False)
    invite = serializers.CharField(max_length=100, required=False, help_text="invitation token: join its tenant")

    def validate(self, attrs: dict) -> dict:
        if not attrs.get("invite") and not attrs.get("tenant_name"):
            raise serializers.ValidationError({"tenant_name": "required unless you sign up with an invite"})
        # Django's validators (settings.AUTH_PASSWORD_VALIDATORS), as a password reset applies
        # them: "password" or the address itself is refused here too, next to the field.
        email = attrs["email"].lower()
        candidate = get_user_model()(username=email, email=email)
        try:
            password_validation.validate_password(attrs["password"], user=candidate)
        except DjangoValidationError as exc:
            raise serializers.ValidationError({"password": list(exc.messages)}) from exc
        return attrs


class PasswordChangeSerializer(serializers.Serializer):
    current_password = serializers.CharField(write_only=True)
    new_password = serializers.CharField(min_length=8, write_only=True)


class PasswordResetRequestSerializer(serializers.Serializer):
    email = serializers.EmailField(max_length=150)


class PasswordResetConfirmSerializer(serializers.Serializer):
    """The two parts of a reset link (``/reset-password/<uid>/<token>``) and the new password."""

    uid = serializers.CharField(max_length=64)
    token = serializers.CharField(max_length=128)
    new_password = serializers.CharField(min_length=8, max_length=4096, write_only=True)
    #: Revoke every API key the account minted before the reset (whoever held the account may
    #: hold one); false keeps them, and the choice is audited.
    revoke_api_keys = serializers.BooleanField(default=True)


class VerifyEmailSerializer(serializers.Serializer):
    """The token of a ``/verify-email/<token>`` link mailed at sign-up."""

    token = serializers.CharField(max_length=1024)


class EmailChangeSerializer(serializers.Serializer):
    #: The email is also the username, whose column holds 150 characters.
    new_email = serializers.EmailField(max_length=150)
    current_password = serializers.CharField(max_length=4096, write_only=True)


class EmailChangeConfirmSerializer(serializers.Serializer):
    """The token of a ``/confirm-email/<token>`` link."""

    token = serializers.CharField(max_length=1024)


class LoginSerializer(serializers.Serializer):
    """Sign-in with an email address or a username (the operator's ``admin`` from ``make up``
    has a username; console users sign up with their email, which is also their username).
    ``email`` keeps its name for existing clients; it becomes the username to authenticate."""

    email = serializers.CharField(max_length=254, help_text="email address or username")
    password = serializers.CharField(write_only=True)

    def validate_email(self, value: str) -> str:
        return accounts.login_name(value)


class SwitchTenantSerializer(serializers.Serializer):
    tenant = serializers.IntegerField(min_value=1)
