"""Request validation and response shapes; no business logic (that lives in api/services)."""

from __future__ import annotations

from datetime import UTC, datetime

from django.contrib.auth import get_user_model, password_validation
from django.core.exceptions import ValidationError as DjangoValidationError
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from api import parsers
from api.models import ApiKey, AuditLog, Invitation, KVFile, Membership, Program, ProgramVersion, Run
from api.services import accounts, programs, run_report
from api.services.quotas import SANDBOX_RESOURCES
from api.services.run_args import program_args
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


class TenantCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=200)


class TenantCloseSerializer(serializers.Serializer):
    #: The tenant's slug, typed by the owner: closing deletes its data and cannot be undone.
    confirm = serializers.CharField(max_length=64, trim_whitespace=True)


class StaffTenantPlanSerializer(serializers.Serializer):
    plan = serializers.CharField(max_length=32)


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
    """Sign-in with an email address or a username (the operator's ``admin`` from ``make up``
    has a username; console users sign up with their email, which is also their username).
    ``email`` keeps its name for existing clients; it becomes the username to authenticate."""

    email = serializers.CharField(max_length=254, help_text="email address or username")
    password = serializers.CharField(write_only=True)

    def validate_email(self, value: str) -> str:
        return accounts.login_name(value)


class SwitchTenantSerializer(serializers.Serializer):
    tenant = serializers.IntegerField(min_value=1)


class ApiKeySerializer(serializers.ModelSerializer):
    """An API key. A new one needs at least one scope (all four when ``scopes`` is left out) and
    an ``expires_at`` in the future, if any: a key without either could only ever be refused."""

    scopes = serializers.ListField(
        child=serializers.ChoiceField(choices=KEY_SCOPES),
        required=False,
        allow_empty=False,
        max_length=len(KEY_SCOPES),
        default=lambda: list(KEY_SCOPES),
    )

    class Meta:
        model = ApiKey
        fields = ["id", "name", "prefix", "scopes", "created_at", "expires_at", "last_used_at", "revoked_at"]
        read_only_fields = ["id", "prefix", "created_at", "last_used_at", "revoked_at"]

    def validate_scopes(self, value: list[str]) -> list[str]:
        return list(dict.fromkeys(value))

    def validate_expires_at(self, value: datetime | None) -> datetime | None:
        if value is not None and value <= timezone.now():
            raise serializers.ValidationError("expires_at must be in the future.")
        return value


class ProgramVersionSerializer(serializers.ModelSerializer):
    class Meta:
        model = ProgramVersion
        fields = ["number", "kind", "sha256", "size", "created_at"]


class BoundedJSONField(serializers.JSONField):
    """A JSON form field (``default_args`` of a multipart upload): one nested too deeply for
    Python's json module is a 400 like a too-deep JSON body (api/parsers.py), not a
    RecursionError. Its value still goes through the field's validators (``storable_json``)."""

    def to_internal_value(self, data: object) -> object:
        try:
            return super().to_internal_value(data)
        except RecursionError:
            raise serializers.ValidationError(parsers.TOO_DEEP) from None


class ProgramSerializer(serializers.ModelSerializer):
    file = serializers.FileField(write_only=True)
    default_args = BoundedJSONField(required=False)
    latest_version = serializers.SerializerMethodField()

    class Meta:
        model = Program
        fields = ["id", "name", "description", "default_args", "created_at", "latest_version", "file"]
        read_only_fields = ["id", "created_at", "latest_version"]

    def validate_name(self, value: str) -> str:
        """Names appear in URLs, CLI arguments and ``tenant/name`` labels: no path separators or
        control characters (spaces around it are trimmed by the field)."""
        bad = sorted({c for c in value if c in "/\\" or ord(c) < 32 or ord(c) == 127})
        if bad:
            shown = ", ".join(repr(c) for c in bad)
            raise serializers.ValidationError(f"must not contain {shown}: use letters, digits, '-', '_' or '.'.")
        return value

    def validate_default_args(self, value: object) -> object:
        return storable_json(value)

    def validate(self, attrs: dict) -> dict:
        """Without ``default_args``, a ``.py`` program's declared example (an ``Example args:``
        line of its docstring, api/services/programs.py) becomes them, so the console's run form
        opens with arguments that work rather than ``{}``."""
        upload = attrs.get("file")
        if upload is not None and upload.name.endswith(".py"):
            source = upload.read()
            upload.seek(0)
            example = programs.declared_example_args(source) if "default_args" not in attrs else None
            if example is not None:
                attrs["default_args"] = example
            # Likewise an empty description: the docstring's first paragraph says what it does.
            if not attrs.get("description"):
                attrs["description"] = programs.declared_description(source)
        return attrs

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
    memory_mb = serializers.IntegerField(required=False, min_value=1, max_value=SANDBOX_RESOURCES["memory_mb"][1])
    pids = serializers.IntegerField(required=False, min_value=1, max_value=SANDBOX_RESOURCES["pids"][1])
    output_limit_bytes = serializers.IntegerField(
        required=False, min_value=1, max_value=SANDBOX_RESOURCES["output_limit_bytes"][1]
    )
    #: The KV files the run will open: it is routed to the worker holding them (a hint for
    #: routing, api/services/routing.py; the run may open others, and these need not exist).
    kv_files = serializers.ListField(
        child=serializers.CharField(max_length=255, validators=[reject_nul]), required=False, max_length=64
    )

    def to_internal_value(self, data: object) -> dict:
        if isinstance(data, dict):
            unknown = sorted(str(k) for k in data if k not in self.fields)
            if unknown:
                known = ", ".join(self.fields)
                raise serializers.ValidationError({k: [f"not a run limit; known: {known}"] for k in unknown})
        return dict(super().to_internal_value(data))

    def _within_plan(self, value: float, limit: float | None, what: str) -> None:
        """A per-request value past the plan (``plan`` in the context: PlanLimits) is a 400 next
        to its field: the request itself is wrong, retrying it later would not help (a 429 is
        for a limit that frees up: concurrent runs, the monthly allowance)."""
        if limit is not None and value > limit:
            raise serializers.ValidationError(f"can be at most {limit:,} {what} on this tenant's plan")

    def validate_max_tokens(self, value: int) -> int:
        plan = self.context.get("plan")
        self._within_plan(value, plan and plan.max_tokens_per_run, "tokens")
        return value

    def validate_deadline_s(self, value: float) -> float:
        plan = self.context.get("plan")
        self._within_plan(value, plan and plan.max_run_seconds, "seconds")
        return value

    def validate_memory_mb(self, value: int) -> int:
        """Past the plan's ``max_memory_mb`` (the ``plan`` in the context: PlanLimits) is refused,
        not quietly lowered: the run would otherwise be killed for memory it was told it had."""
        plan = self.context.get("plan")
        if plan is not None and value > plan.max_memory_mb:
            raise serializers.ValidationError(f"above the plan's limit of {plan.max_memory_mb} MiB")
        return value


class RunCreateSerializer(serializers.Serializer):
    # Bounded like the columns they are looked up in (bigint id, integer version): a larger
    # number is a 400 here, not a PostgreSQL range error.
    program = serializers.IntegerField(min_value=1, max_value=2**63 - 1)
    version = serializers.IntegerField(required=False, allow_null=True, min_value=1, max_value=2**31 - 1)
    args = serializers.DictField(required=False, default=dict, validators=[storable_json])
    limits = RunLimitsSerializer(required=False, default=dict)
    name = serializers.CharField(
        required=False,
        allow_blank=True,
        default="",
        max_length=Run._meta.get_field("name").max_length,
        validators=[reject_nul],
        help_text="what to call the run; left out, its program's name and first argument",
    )


class IdempotencyKeySerializer(serializers.Serializer):
    """The ``Idempotency-Key`` header of ``POST /runs``: bounded like the column that stores it."""

    key = serializers.CharField(
        max_length=Run._meta.get_field("idempotency_key").max_length, required=False, allow_blank=True
    )


class RunFilterSerializer(serializers.Serializer):
    """``GET /runs`` query parameters: a malformed one is a 400, not a query that fails."""

    status = serializers.ChoiceField(choices=Run.STATUSES, required=False)
    program = serializers.IntegerField(min_value=1, max_value=2**63 - 1, required=False)
    parent = serializers.UUIDField(required=False, help_text="only the runs this run spawned")


class RunLogsSerializer(serializers.ModelSerializer):
    truncated = serializers.BooleanField(source="output_truncated", read_only=True)

    class Meta:
        model = Run
        fields = ["id", "status", "stdout", "stderr", "truncated"]
        read_only_fields = fields


class ToolHostsSerializer(serializers.Serializer):
    """``PUT /tool-hosts``: the whole list (``host`` or ``host:port`` entries)."""

    hosts = serializers.ListField(
        child=serializers.CharField(max_length=260, validators=[reject_nul]), max_length=1000, allow_empty=True
    )


class RunCostSerializer(serializers.Serializer):
    currency = serializers.CharField()
    total = serializers.CharField(help_text="USD, to the micro-dollar")
    lines = serializers.DictField(child=serializers.CharField(), help_text="amount per billed counter (non-zero)")


class RunUsageSerializer(serializers.Serializer):
    """Shape of a run's ``usage`` (documentation only: ``run_report.usage`` builds it)."""

    prefill_tokens = serializers.IntegerField()
    cached_tokens = serializers.IntegerField(
        help_text="prompt tokens not computed: served from the tenant's prefix cache or stored KV files "
        "the run opened (billed at the plan's cached_token_price_ratio of a prefill token)"
    )
    decode_tokens = serializers.IntegerField()
    pred_calls = serializers.IntegerField()
    forwards = serializers.IntegerField(help_text="forward passes that carried the run's pred calls")
    page_seconds = serializers.FloatField()
    sandbox_seconds = serializers.FloatField()
    io_calls = serializers.IntegerField()
    streamed_events = serializers.IntegerField()
    streamed_bytes = serializers.IntegerField()
    cost = RunCostSerializer()


class RunTimingsSerializer(serializers.Serializer):
    queue_wait_s = serializers.FloatField(allow_null=True)
    run_s = serializers.FloatField(allow_null=True)
    time_to_first_token_s = serializers.FloatField(allow_null=True)


class RunChildSerializer(serializers.Serializer):
    """A run a run spawned (``symphony.spawn``), as its parent lists it."""

    id = serializers.UUIDField()
    status = serializers.CharField()
    entry = serializers.CharField(help_text="module:function of the bundle; empty: the program's main")


class RunSerializer(serializers.ModelSerializer):
    """A run. One run (not a list of them) also has ``usage`` (``null`` until it has ended),
    ``timings`` and ``children`` (the runs it spawned, oldest first); ``parent`` is the run
    that spawned it (``null`` for a run a client started)."""

    program = serializers.IntegerField(source="program_version.program_id", read_only=True)
    program_name = serializers.CharField(source="program_version.program.name", read_only=True)
    version = serializers.IntegerField(source="program_version.number", read_only=True)
    usage = serializers.SerializerMethodField()
    timings = serializers.SerializerMethodField()
    children = serializers.SerializerMethodField()
    cancelled_by = serializers.SerializerMethodField(
        help_text="One run only: who cancelled it, the person's email or `API key sk_<prefix>_…`; "
        "null when nobody did (not cancelled, or ended with the run that spawned it)."
    )

    @extend_schema_field(serializers.CharField(allow_null=True, required=False))
    def get_cancelled_by(self, run: Run) -> str | None:
        if self._in_list() or run.status != "cancelled":
            return None
        entry = (
            AuditLog.objects.filter(action="run.cancel", target=str(run.pk), tenant_id=run.tenant_id)
            .select_related("actor")
            .first()
        )
        if entry is None:
            return None
        if entry.actor is not None:
            return entry.actor.email
        prefix = entry.detail.get("api_key")
        return f"API key sk_{prefix}_…" if prefix else None

    @extend_schema_field(RunChildSerializer(many=True, required=False))
    def get_children(self, run: Run) -> list[dict]:
        if self._in_list():
            return []
        rows = run.children.order_by("created_at").values("id", "status", "entry")
        return [{"id": str(r["id"]), "status": r["status"], "entry": r["entry"]} for r in rows]

    @extend_schema_field(RunUsageSerializer(allow_null=True, required=False))
    def get_usage(self, run: Run) -> dict | None:
        return None if self._in_list() else run_report.usage(run)

    @extend_schema_field(RunTimingsSerializer(required=False))
    def get_timings(self, run: Run) -> dict:
        return run_report.timings(run)

    def _in_list(self) -> bool:
        return isinstance(self.parent, serializers.ListSerializer)

    def to_representation(self, instance: Run) -> dict:
        data = super().to_representation(instance)
        data["args"] = program_args(data["args"])  # as the program saw them (U+0000 included)
        if self._in_list():  # a page of runs: no per-run queries
            data.pop("usage", None)
            data.pop("timings", None)
            data.pop("children", None)
            data.pop("cancelled_by", None)
        return data

    class Meta:
        model = Run
        fields = [
            "id",
            "name",
            "program",
            "program_name",
            "version",
            "status",
            "args",
            "limits",
            "result",
            "error",
            "exit_code",
            "worker",
            "parent",
            "depth",
            "entry",
            "created_at",
            "started_at",
            "finished_at",
            "usage",
            "timings",
            "cancelled_by",
            "children",
        ]
        read_only_fields = fields


@extend_schema_field(OpenApiTypes.DATETIME)
class EpochAsISOField(serializers.Field):
    """Unix seconds stored as the worker reports them, shown as ISO 8601 like every other
    timestamp of the API."""

    def to_representation(self, value: float) -> str:
        return datetime.fromtimestamp(float(value), tz=UTC).isoformat().replace("+00:00", "Z")


class KVFileSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    last_used = EpochAsISOField(read_only=True, allow_null=True)

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
