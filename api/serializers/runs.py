"""Runs: what a new run may ask for, the ``GET /runs`` filters, and a run as the API shows it
(api/views/runs.py)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from api.models import AuditLog, Run
from api.services import run_report
from api.services.quotas import SANDBOX_RESOURCES
from api.services.run_args import program_args
from api.validators import reject_nul, storable_json


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
