"""Tenants, members, invitations and the audit log (api/views/team.py)."""

from __future__ import annotations

from rest_framework import serializers

from api.models import AuditLog, Invitation, Membership


class TenantCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=200)


class TenantCloseSerializer(serializers.Serializer):
    #: The tenant's slug, typed by the owner: closing deletes its data and cannot be undone.
    confirm = serializers.CharField(max_length=64, trim_whitespace=True)


class MemberSerializer(serializers.ModelSerializer):
    user_id = serializers.IntegerField(source="user.id", read_only=True)
    email = serializers.EmailField(source="user.email", read_only=True)

    class Meta:
        model = Membership
        fields = ["id", "user_id", "email", "role", "joined_at"]
        read_only_fields = ["id", "user_id", "email", "joined_at"]


class MemberRoleSerializer(serializers.Serializer):
    role = serializers.ChoiceField(choices=Membership.ROLES)


class InvitationSerializer(serializers.ModelSerializer):
    invited_by = serializers.EmailField(source="invited_by.email", read_only=True, allow_null=True, default=None)

    class Meta:
        model = Invitation
        fields = ["id", "email", "role", "invited_by", "created_at", "expires_at"]
        read_only_fields = ["id", "invited_by", "created_at", "expires_at"]
        extra_kwargs = {"role": {"default": "member"}}


class NewInvitationSerializer(InvitationSerializer):
    token = serializers.CharField(read_only=True, help_text="shown once: the console link is /invite/<token>")
    emailed = serializers.BooleanField(
        read_only=True, help_text="the link was also queued to be mailed to the invitee (false: pass it on yourself)"
    )

    class Meta(InvitationSerializer.Meta):
        fields = [*InvitationSerializer.Meta.fields, "token", "emailed"]
        read_only_fields = fields


class InvitationPreviewSerializer(serializers.ModelSerializer):
    """What the invite link shows before anyone signs in: whom it invites, where, as what."""

    tenant_name = serializers.CharField(source="tenant.name", read_only=True)
    invited_by = serializers.EmailField(source="invited_by.email", read_only=True, allow_null=True, default=None)

    class Meta:
        model = Invitation
        fields = ["tenant_name", "email", "role", "invited_by", "expires_at"]
        read_only_fields = fields


class AuditLogSerializer(serializers.ModelSerializer):
    actor = serializers.EmailField(source="actor.email", read_only=True, allow_null=True, default=None)

    class Meta:
        model = AuditLog
        fields = ["id", "actor", "action", "target", "detail", "created_at"]
        read_only_fields = fields
