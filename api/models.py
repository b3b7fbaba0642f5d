"""Control-plane data: tenants and members, API keys, programs and versions, runs, usage, audit."""

from __future__ import annotations

import uuid
from decimal import Decimal

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone

from api.fields import JSONAsSentField


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
    #: Fraction of each worker's device KV pool the tenant's *pinned* KV files may hold (pinned
    #: files are never spilled; a pin past it is refused with EDQUOT). Fractions, not pages, so
    #: one plan fits workers of any size (gpu_worker/kvfs/quota.py).
    kv_pinned_device_share = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(0.0), MaxValueValidator(1.0)]
    )
    #: Fraction of each worker's host-memory KV tier the tenant's spilled files may hold (past it
    #: its own oldest go to disk, never another tenant's).
    kv_host_share = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(0.0), MaxValueValidator(1.0)]
    )
    #: Named (persistent) KV files the tenant may have; creating one more is refused (EDQUOT).
    max_kv_files = models.PositiveIntegerField(null=True, blank=True)
    #: Share of contended forward passes, relative to other tenants' (the worker's fair scheduler
    #: serves tenants in proportion to it while they compete; 2 = twice a weight-1 tenant's tokens).
    scheduling_weight = models.FloatField(default=1.0, validators=[MinValueValidator(0.01), MaxValueValidator(1000)])
    #: Control-plane requests per minute of the whole tenant (every key and member together):
    #: REST API, run events, OpenAI endpoints (api/throttling.py). ``None``: unlimited.
    api_requests_per_minute = models.PositiveIntegerField(null=True, blank=True, default=600)
    #: Event streams the tenant may hold open at once (run events and ``/v1`` requests waiting
    #: on their run); ``None``: ``SYMPHONY_STREAMS_PER_TENANT`` (api/services/stream_leases.py).
    max_concurrent_streams = models.PositiveIntegerField(null=True, blank=True, validators=[MinValueValidator(1)])
    #: Bytes one run may send to its client with ``send_to_user`` (as stored in its event
    #: stream); the worker answers EDQUOT past it. ``None``: the worker's default (64 MiB).
    stream_bytes_per_run = models.BigIntegerField(
        null=True, blank=True, default=16 * 1024 * 1024, validators=[MinValueValidator(1)]
    )
    #: USD per GiB a tenant's runs send to their clients (invoices' ``streamed_bytes`` line).
    streamed_gib_price = models.DecimalField(max_digits=10, decimal_places=4, default=Decimal("0.10"))
    #: A cached prompt token (served from the prefix cache or a stored KV file, not computed) costs
    #: this fraction of a prefill token (invoices' ``cached_tokens`` line).
    cached_token_price_ratio = models.DecimalField(
        max_digits=5,
        decimal_places=4,
        default=Decimal("0.1"),
        validators=[MinValueValidator(Decimal("0")), MaxValueValidator(Decimal("1"))],
    )
    #: The most memory (MiB) one run's sandbox may ask for in its ``limits.memory_mb``; a run
    #: asking for more is refused (400). Never above what the sandbox allows at all (4096).
    max_memory_mb = models.PositiveIntegerField(
        default=1024, validators=[MinValueValidator(64), MaxValueValidator(4096)]
    )
    #: Entries a tenant's owners may put on its tool-host allowlist (``PUT /tool-hosts``).
    max_tool_hosts = models.PositiveIntegerField(default=8, validators=[MaxValueValidator(1000)])
    #: Runs one run may ``spawn`` in its life (children, not descendants; a spawn past it is
    #: refused at once, EDQUOT): a LIP spawning in a loop stops here (api/services/procs.py).
    max_children_per_run = models.PositiveIntegerField(default=8, validators=[MaxValueValidator(1000)])
    #: Levels of a run tree below the run a client started (1: children only, 0: no spawn):
    #: a LIP that spawns itself recursively stops here.
    max_spawn_depth = models.PositiveIntegerField(default=2, validators=[MaxValueValidator(16)])
    #: Seconds a stored ``/v1/responses`` conversation keeps its KV file after its last turn
    #: (billed as KV storage like any KV file); 0 keeps none (follow-ups are recomputed).
    response_kv_ttl_s = models.PositiveIntegerField(default=3600, validators=[MaxValueValidator(30 * 86400)])

    def __str__(self) -> str:
        return self.name


def user_account_key(user_id: int) -> str:
    """The account of the person with ``user_id``: every tenant they create counts against it
    (``Tenant.account_key``), and so do their console requests before a tenant is known."""
    return f"u{user_id}"


class Tenant(models.Model):
    """A billing and isolation unit; every tenant resource carries a foreign key to one."""

    name = models.CharField(max_length=200)
    slug = models.SlugField(max_length=64, unique=True)
    plan = models.CharField(max_length=32, default="free")
    #: ``host`` or ``host:port`` entries a LIP of this tenant may reach through ``http_fetch``.
    allowed_tool_hosts = models.JSONField(default=list, blank=True)
    #: The person whose account this tenant counts against: the user who created it. Bounds on
    #: shared pools apply to an account across all its tenants (gpu_worker/resource_model.py),
    #: so creating more tenants multiplies none of them. ``None`` for tenants made by staff or
    #: scripts: each is then an account of its own.
    account = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="created_tenants"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    #: Set when an owner closes the tenant (api/services/tenant_closure.py): from then on no key,
    #: member or run can use it. The row stays as the tombstone its usage and audit rows bill to.
    closed_at = models.DateTimeField(null=True, blank=True)
    #: Set once the closed tenant's programs, runs, keys and KV files have been deleted.
    purged_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return self.slug

    @property
    def account_key(self) -> str:
        """The account's name on the wire and in counters: ``u<user id>``, or ``t<tenant id>``
        for a tenant with no creator of record."""
        return user_account_key(self.account_id) if self.account_id is not None else f"t{self.pk}"


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
    #: What people call the run: the one it was started with, else its program's name and first
    #: argument (api/services/run_args.py default_run_name), so lists read as more than ids.
    name = models.CharField(max_length=200, blank=True, default="")
    api_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL)
    status = models.CharField(max_length=16, default="queued", db_index=True)
    args = models.JSONField(default=dict)
    limits = models.JSONField(default=dict)
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001 - NULL keeps the unique constraint off unkeyed runs
    #: SHA-256 of the request a keyed run was created from, so the key reused with another body
    #: is refused instead of answering the first run (empty for runs made before it was kept).
    idempotency_digest = models.CharField(max_length=64, blank=True, default="")
    #: The program's result, key order as it returned it (``json``, not ``jsonb``).
    result = JSONAsSentField(null=True, blank=True)
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
    #: When the program first sent something to its client (``send_to_user``), as the worker
    #: saw it; null when it sent nothing. Time to first token is this less ``created_at``.
    first_output_at = models.DateTimeField(null=True, blank=True)
    #: The run whose LIP spawned this one (``symphony.spawn``), null for a run a client started.
    #: Children are executed by their parent's executor, on its worker (api/services/procs.py).
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children")
    #: Levels below the run a client started: 0 for it, 1 for its children, ...
    depth = models.PositiveSmallIntegerField(default=0)
    #: What a spawned run executes of its program's bundle: ``module[:function]`` ("" or
    #: "self": the program's own ``main``); always "" for a run a client started.
    entry = models.CharField(max_length=200, blank=True, default="")
    #: The W3C ``traceparent`` the client sent with the request that created the run, validated
    #: (api/services/trace_context.py; "" when none or malformed): the exported run span's parent.
    traceparent = models.CharField(max_length=55, blank=True, default="")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "idempotency_key"], name="run_idempotency_per_tenant")]
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"run {self.pk} ({self.status})"


class RunTrace(models.Model):
    """Where a run's time went, as its executor recorded it when the run ended: its own marks
    (session, sandbox start warm or cold) and the worker's bounded spans of the session
    (api/services/run_traces.py builds the tree served by ``GET /runs/<id>/trace``). A table of
    its own so run pages never load it; deleted with its run (same retention)."""

    run = models.OneToOneField(Run, primary_key=True, on_delete=models.CASCADE, related_name="trace")
    #: ``run_traces.RecordedTrace``: bounded (``gpu_worker.tracing`` MAX_SPANS, MAX_BUCKETS).
    data = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"trace of run {self.run_id}"


class UsageRecord(models.Model):
    """What one run consumed (written once per run, even when the run failed), or, with no run,
    one metering period of a tenant's stored KV files."""

    #: The metered counters, in the order invoices list them.
    METERED = (
        "prefill_tokens",
        "cached_tokens",
        "decode_tokens",
        "pred_calls",
        "page_seconds",
        "io_calls",
        "sandbox_seconds",
        "kv_gib_hours",
        "streamed_bytes",
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
    #: Bytes the run's LIP sent to its client (``send_to_user``), priced by the tenant's plan.
    streamed_bytes = models.BigIntegerField(default=0)
    #: Prompt tokens the run did not compute: served from the tenant's prefix cache or held by
    #: stored KV files it opened. Billed at the plan's ``cached_token_price_ratio`` of prefill.
    cached_tokens = models.BigIntegerField(default=0)
    #: Not billed, shown with the run: events sent to the client, forward passes that carried
    #: its ``pred`` calls.
    streamed_events = models.BigIntegerField(default=0)
    forwards = models.BigIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    def __str__(self) -> str:
        return f"usage run={self.run_id}"

    def save(self, *args, **kwargs) -> None:
        if self.run_id is not None:
            self.from_run = True
        super().save(*args, **kwargs)


class MonthlyTokens(models.Model):
    """A tenant's prompt and generated tokens of one calendar month (UTC), kept by the database.

    Admission reads the month's tokens on the path of every run and every ``/v1`` request
    (``api/services/quotas.py``); summing the usage rows there cost ~1 µs a row, growing with
    every request a tenant made that month. A trigger on ``api_usagerecord`` (migration 0028)
    adds each row's ``prefill_tokens + decode_tokens`` here in the transaction that writes the
    row, and subtracts it when the row changes or goes, so this stays exact whichever path
    writes usage (a run's finish, the storage meter, the admin, a test): read it, never write it.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="monthly_tokens")
    #: The first day of the month the usage rows were created in.
    month = models.DateField()
    tokens = models.BigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "month"], name="monthly_tokens_per_tenant")]

    def __str__(self) -> str:
        return f"{self.tenant_id} {self.month:%Y-%m}: {self.tokens} tokens"


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


class StoredResponse(models.Model):
    """One ``/v1/responses`` response stored for retrieval and ``previous_response_id``
    (``store`` true): the turn's own input items, its output items and the link to the turn it
    continues, so a conversation can always be rebuilt from these rows (the KV file named
    ``kv_name`` only saves recomputing it, and may be gone)."""

    STATUSES = ["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="responses")
    run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    previous = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    status = models.CharField(max_length=16, default="in_progress")
    #: The request's echoed settings (instructions, tools, tool_choice, sampling, metadata...).
    request = JSONAsSentField(default=dict)
    #: This turn's input items as given (normalised to item objects), in order.
    input_items = JSONAsSentField(default=list)
    output = JSONAsSentField(default=list)
    usage = JSONAsSentField(null=True, blank=True)
    error = JSONAsSentField(null=True, blank=True)
    #: The conversation's KV file (shared along a chain of turns) and when it may be removed.
    kv_name = models.CharField(max_length=100, blank=True, default="")
    kv_expires_at = models.DateTimeField(null=True, blank=True, db_index=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"resp_{self.pk.hex}"


class UnverifiedEmail(models.Model):
    """A user who signed up and has not yet opened the link mailed to their address.

    Only console sign-up creates one (api/services/accounts.py), so every other user is verified:
    ``createsuperuser``, ``create_demo``, invitees (the invitation mail proved the address) and the
    rows that existed before verification did. Until it is gone the account may not mint API keys,
    start runs or upload programs: whoever signed up with an address they do not own gets nothing
    that outlives the real owner taking the address back. Opening the link, a password reset and
    a confirmed email change delete it (each proves the address)."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="unverified_email")
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"unverified {self.user_id}"
