"""Request validation and response shapes; no business logic (that lives in api/services)."""

from __future__ import annotations

from rest_framework import serializers

from api.models import ApiKey, AuditLog, Invitation, KVFile, Membership, Program, ProgramVersion, Run
from api.tenancy import KEY_SCOPES
from api.validators import reject_nul, storable_json


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


class EmailChangeSerializer(serializers.Serializer):
    #: The email is also the username, whose column holds 150 characters.
    new_email = serializers.EmailField(max_length=150)
    current_password = serializers.CharField(max_length=4096, write_only=True)


class EmailChangeConfirmSerializer(serializers.Serializer):
    """The token of a ``/confirm-email/<token>`` link."""

    token = serializers.CharField(max_length=1024)


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


class LoginSerializer(serializers.Serializer):
    email = serializers.EmailField()
    password = serializers.CharField(write_only=True)


class SwitchTenantSerializer(serializers.Serializer):
    tenant = serializers.IntegerField(min_value=1)


class ApiKeySerializer(serializers.ModelSerializer):
    scopes = serializers.ListField(
        child=serializers.ChoiceField(choices=KEY_SCOPES), required=False, default=lambda: list(KEY_SCOPES)
    )

    class Meta:
        model = ApiKey
        fields = ["id", "name", "prefix", "scopes", "created_at", "expires_at", "last_used_at", "revoked_at"]
        read_only_fields = ["id", "prefix", "created_at", "last_used_at", "revoked_at"]


class ProgramVersionSerializer(serializers.ModelSerializer):
    class Meta:
        model = ProgramVersion
        fields = ["number", "kind", "sha256", "size", "created_at"]


class ProgramSerializer(serializers.ModelSerializer):
    file = serializers.FileField(write_only=True)
    latest_version = serializers.SerializerMethodField()

    class Meta:
        model = Program
        fields = ["id", "name", "description", "default_args", "created_at", "latest_version", "file"]
        read_only_fields = ["id", "created_at", "latest_version"]

    def validate_default_args(self, value: object) -> object:
        return storable_json(value)

    def get_latest_version(self, obj: Program) -> int | None:
        return obj.versions.order_by("-number").values_list("number", flat=True).first()


class VersionUploadSerializer(serializers.Serializer):
    file = serializers.FileField()


class RunLimitsSerializer(serializers.Serializer):
    """What a run may ask for itself, typed and bounded here so a bad value is a 400 naming it,
    not a 500 (or a failure at execution). The plan caps each one again when the run starts
    (api/services/quotas.py, api/services/execution.py); unknown keys are refused rather than
    silently ignored. Scheduling weight is not here: it is the operator's, not the tenant's."""

    max_tokens = serializers.IntegerField(required=False, min_value=1, max_value=2**31 - 1)
    deadline_s = serializers.FloatField(required=False, min_value=0.001, max_value=7 * 86400)
    max_pages = serializers.IntegerField(required=False, min_value=1, max_value=2**31 - 1)
    max_kv_bytes = serializers.IntegerField(required=False, min_value=1, max_value=2**62)
    allowed_hosts = serializers.ListField(
        child=serializers.CharField(max_length=260, validators=[reject_nul]), required=False, max_length=256
    )
    memory_mb = serializers.IntegerField(required=False, min_value=1, max_value=2**31 - 1)
    pids = serializers.IntegerField(required=False, min_value=1, max_value=2**31 - 1)
    output_limit_bytes = serializers.IntegerField(required=False, min_value=1, max_value=2**62)

    def to_internal_value(self, data: object) -> dict:
        if isinstance(data, dict):
            unknown = sorted(str(k) for k in data if k not in self.fields)
            if unknown:
                known = ", ".join(self.fields)
                raise serializers.ValidationError({k: [f"not a run limit; known: {known}"] for k in unknown})
        return dict(super().to_internal_value(data))


class RunCreateSerializer(serializers.Serializer):
    # Bounded like the columns they are looked up in (bigint id, integer version): a larger
    # number is a 400 here, not a PostgreSQL range error.
    program = serializers.IntegerField(min_value=1, max_value=2**63 - 1)
    version = serializers.IntegerField(required=False, allow_null=True, min_value=1, max_value=2**31 - 1)
    args = serializers.DictField(required=False, default=dict, validators=[storable_json])
    limits = RunLimitsSerializer(required=False, default=dict)


class IdempotencyKeySerializer(serializers.Serializer):
    """The ``Idempotency-Key`` header of ``POST /runs``: bounded like the column that stores it."""

    key = serializers.CharField(
        max_length=Run._meta.get_field("idempotency_key").max_length, required=False, allow_blank=True
    )


class RunFilterSerializer(serializers.Serializer):
    """``GET /runs`` query parameters: a malformed one is a 400, not a query that fails."""

    status = serializers.ChoiceField(choices=Run.STATUSES, required=False)
    program = serializers.IntegerField(min_value=1, max_value=2**63 - 1, required=False)


class RunLogsSerializer(serializers.ModelSerializer):
    truncated = serializers.BooleanField(source="output_truncated", read_only=True)

    class Meta:
        model = Run
        fields = ["id", "status", "stdout", "stderr", "truncated"]
        read_only_fields = fields


class RunSerializer(serializers.ModelSerializer):
    program = serializers.IntegerField(source="program_version.program_id", read_only=True)
    version = serializers.IntegerField(source="program_version.number", read_only=True)

    class Meta:
        model = Run
        fields = [
            "id",
            "program",
            "version",
            "status",
            "args",
            "limits",
            "result",
            "error",
            "exit_code",
            "worker",
            "created_at",
            "started_at",
            "finished_at",
        ]
        read_only_fields = fields


class KVFileSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = KVFile
        fields = ["id", "tenant", "worker", "name", "tokens", "bytes", "residency", "pinned", "last_used", "synced_at"]
        read_only_fields = fields


class PinSerializer(serializers.Serializer):
    pinned = serializers.BooleanField()


class AuditLogSerializer(serializers.ModelSerializer):
    actor = serializers.EmailField(source="actor.email", read_only=True, allow_null=True, default=None)

    class Meta:
        model = AuditLog
        fields = ["id", "actor", "action", "target", "detail", "created_at"]
        read_only_fields = fields
