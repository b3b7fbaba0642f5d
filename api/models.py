"""Control-plane data: tenants and members, API keys, programs and versions, runs, usage, audit."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone


class Plan(models.Model):
    """What a tenant may use; checked at run admission and passed to the worker as session limits.

    ``None`` in a limit field means unlimited. Plans are rows (editable in the Django admin) so an
    operator can change a price tier without a deploy; "free" and "pro" are created by migration.
    """

    name = models.SlugField(max_length=32, unique=True)
    max_concurrent_runs = models.PositiveIntegerField(default=2)
    max_tokens_per_run = models.PositiveIntegerField(default=4096)
    tokens_per_month = models.BigIntegerField(null=True, blank=True)
    max_run_seconds = models.PositiveIntegerField(default=120)
    #: Device KV pages one run may hold at once (the worker answers ENOSPC beyond).
    max_device_pages_per_run = models.PositiveIntegerField(null=True, blank=True)
    #: Bytes of persistent KV files the tenant may keep stored.
    kv_bytes_stored = models.BigIntegerField(null=True, blank=True)
    #: Share of contended forward passes, relative to other tenants' (the worker's fair scheduler
    #: serves tenants in proportion to it while they compete; 2 = twice a weight-1 tenant's tokens).
    scheduling_weight = models.FloatField(default=1.0, validators=[MinValueValidator(0.01), MaxValueValidator(1000)])
    #: Control-plane requests per minute of the whole tenant (every key and member together):
    #: REST API, run events, OpenAI endpoints (api/throttling.py). ``None``: unlimited.
    api_requests_per_minute = models.PositiveIntegerField(null=True, blank=True, default=600)

    def __str__(self) -> str:
        return self.name


class Tenant(models.Model):
    """A billing and isolation unit; every tenant resource carries a foreign key to one."""

    name = models.CharField(max_length=200)
    slug = models.SlugField(max_length=64, unique=True)
    plan = models.CharField(max_length=32, default="free")
    #: ``host`` or ``host:port`` entries a LIP of this tenant may reach through ``http_fetch``.
    allowed_tool_hosts = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    #: Set when an owner closes the tenant (api/services/tenant_closure.py): from then on no key,
    #: member or run can use it. The row stays as the tombstone its usage and audit rows bill to.
    closed_at = models.DateTimeField(null=True, blank=True)
    #: Set once the closed tenant's programs, runs, keys and KV files have been deleted.
    purged_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return self.slug


class Membership(models.Model):
    ROLES = [("owner", "owner"), ("member", "member")]

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=ROLES, default="member")
    joined_at = models.DateTimeField(default=timezone.now)

    class Meta:
        unique_together = [("user", "tenant")]

    def __str__(self) -> str:
        return f"{self.user_id}@{self.tenant_id}:{self.role}"


class Invitation(models.Model):
    """An owner's offer of a membership to one email address, accepted through a one-time link.

    The owner is shown the link once, and it is mailed to the invitee (api/services/mail.py).
    Only a digest of the token is stored (like API keys), and accepting requires a signed-in user
    with the invited email, so a link that leaks is useless to anyone else."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="invitations")
    email = models.EmailField(max_length=150)
    role = models.CharField(max_length=16, choices=Membership.ROLES, default="member")
    token_hash = models.CharField(max_length=64, unique=True)
    invited_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    accepted_at = models.DateTimeField(null=True, blank=True)
    accepted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"invite {self.email} to {self.tenant_id} as {self.role}"


class ApiKey(models.Model):
    """A bearer secret for one tenant; only an HMAC of the secret is stored."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_keys")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL)
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, unique=True)
    secret_hash = models.CharField(max_length=64)
    scopes = models.JSONField(default=list)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"sk_{self.prefix}_… ({self.name})"


class Program(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="programs")
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True, default="")
    default_args = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        unique_together = [("tenant", "name")]

    def __str__(self) -> str:
        return f"{self.tenant_id}/{self.name}"


class ProgramVersion(models.Model):
    """An immutable upload: a single .py source or a zip archive with a main module."""

    program = models.ForeignKey(Program, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    kind = models.CharField(max_length=8)  # "py" | "zip"
    content = models.BinaryField()
    sha256 = models.CharField(max_length=64)
    size = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        unique_together = [("program", "number")]

    def __str__(self) -> str:
        return f"{self.program_id}@v{self.number}"


class Run(models.Model):
    STATUSES = ["queued", "running", "succeeded", "failed", "timed_out", "cancelled"]
    TERMINAL = {"succeeded", "failed", "timed_out", "cancelled"}

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="runs")
    program_version = models.ForeignKey(ProgramVersion, on_delete=models.PROTECT, related_name="runs")
    api_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL)
    status = models.CharField(max_length=16, default="queued", db_index=True)
    args = models.JSONField(default=dict)
    limits = models.JSONField(default=dict)
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001 - NULL keeps the unique constraint off unkeyed runs
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    exit_code = models.IntegerField(null=True, blank=True)
    #: What the program printed (the tail of each stream, ``SYMPHONY_RUN_OUTPUT_KEEP_BYTES``);
    #: served by ``GET /runs/<id>/logs``, not in the run's own payload.
    stdout = models.TextField(blank=True, default="")
    stderr = models.TextField(blank=True, default="")
    #: Whether either stream was cut to its tail.
    output_truncated = models.BooleanField(default=False)
    worker = models.CharField(max_length=100, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "idempotency_key"], name="run_idempotency_per_tenant")]
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"run {self.pk} ({self.status})"


class UsageRecord(models.Model):
    """What one run consumed (written once per run, even when the run failed), or, with no run,
    one metering period of a tenant's stored KV files."""

    #: The metered counters, in the order invoices list them.
    METERED = (
        "prefill_tokens",
        "decode_tokens",
        "pred_calls",
        "page_seconds",
        "io_calls",
        "sandbox_seconds",
        "kv_gib_hours",
    )

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="usage")
    run = models.OneToOneField(Run, null=True, on_delete=models.SET_NULL, related_name="usage")
    #: A run consumed it. Stays true when the run is deleted later (with its program or its
    #: tenant), so the row is not mistaken for the storage meter's and still counts as a run.
    from_run = models.BooleanField(default=False)
    prefill_tokens = models.BigIntegerField(default=0)
    decode_tokens = models.BigIntegerField(default=0)
    pred_calls = models.BigIntegerField(default=0)
    page_seconds = models.FloatField(default=0.0)
    io_calls = models.BigIntegerField(default=0)
    sandbox_seconds = models.FloatField(default=0.0)
    #: Persistent KV files kept in storage; rows without a run are written by the storage meter.
    kv_gib_hours = models.FloatField(default=0.0)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    def __str__(self) -> str:
        return f"usage run={self.run_id}"

    def save(self, *args, **kwargs) -> None:
        if self.run_id is not None:
            self.from_run = True
        super().save(*args, **kwargs)


class AuditLog(models.Model):
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL)
    tenant = models.ForeignKey(Tenant, null=True, on_delete=models.SET_NULL)
    action = models.CharField(max_length=64)
    target = models.CharField(max_length=200)
    detail = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.action} {self.target}"


class QuotaNotice(models.Model):
    """One mail to a tenant's owners that its usage crossed a share of a monthly quota; the unique
    row makes it one per tenant, quota, month and threshold, however many runs end at once."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="quota_notices")
    quota = models.CharField(max_length=32, default="tokens_per_month")
    period = models.CharField(max_length=7)  # "2026-11"
    percent = models.PositiveSmallIntegerField()
    used = models.BigIntegerField()
    limit = models.BigIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "quota", "period", "percent"], name="one_quota_notice_per_threshold"
            )
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id} {self.quota} {self.period} {self.percent}%"


class KVFile(models.Model):
    """Control-plane mirror of one named KV file on a worker (the worker is the source of truth;
    rows are refreshed from its kv_list on listing and at run end)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="kv_files")
    worker = models.CharField(max_length=100)
    name = models.CharField(max_length=255)
    tokens = models.BigIntegerField(default=0)
    bytes = models.BigIntegerField(default=0)
    residency = models.CharField(max_length=8)
    pinned = models.BooleanField(default=False)
    last_used = models.FloatField(null=True, blank=True)
    synced_at = models.DateTimeField(auto_now=True)

    class Meta:
        unique_together = [("tenant", "worker", "name")]

    def __str__(self) -> str:
        return f"{self.tenant_id}:{self.name}@{self.worker}"
