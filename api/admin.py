"""Django admin for operators: read-mostly views of tenants, keys, programs, runs, usage, audit."""

from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin

from api.models import (
    ApiKey,
    AuditLog,
    Invitation,
    KVFile,
    Membership,
    MonthlyTokens,
    Plan,
    Program,
    ProgramVersion,
    QuotaNotice,
    Run,
    Tenant,
    UsageRecord,
)
from api.services import kvfiles, mail, tenant_closure


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "plan", "created_at", "closed_at", "purged_at"]
    list_filter = [("closed_at", admin.EmptyFieldListFilter)]
    search_fields = ["slug", "name"]
    readonly_fields = ["closed_at", "purged_at"]  # set by closing, never by hand
    actions = ["close_tenants"]

    @admin.action(description="Close and delete their data (stops keys, runs and members now; audited)")
    def close_tenants(self, request, queryset) -> None:
        for tenant in queryset.filter(closed_at__isnull=True):
            report = tenant_closure.close(request.user, tenant, tenant.slug, by_staff=True)
            self.message_user(
                request,
                f"{tenant.slug}: closed; {report.runs_cancelled} run(s) cancelled, "
                f"{report.members_removed} member(s) removed; its data is being deleted",
            )


@admin.register(Plan)
class PlanAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "max_concurrent_runs",
        "max_tokens_per_run",
        "tokens_per_month",
        "max_run_seconds",
        "max_device_pages_per_run",
        "kv_bytes_stored",
        "kv_pinned_device_share",
        "kv_host_share",
        "max_kv_files",
        "max_memory_mb",
        "max_tool_hosts",
        "max_children_per_run",
        "max_spawn_depth",
        "scheduling_weight",
        "api_requests_per_minute",
        "max_concurrent_streams",
        "stream_bytes_per_run",
        "streamed_gib_price",
        "cached_token_price_ratio",
    ]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ["prefix", "name", "tenant", "created_at", "last_used_at", "revoked_at"]
    readonly_fields = ["prefix", "secret_hash", "last_used_at"]


@admin.register(Invitation)
class InvitationAdmin(admin.ModelAdmin):
    list_display = ["email", "tenant", "role", "invited_by", "created_at", "expires_at", "accepted_at", "revoked_at"]
    readonly_fields = ["token_hash", "accepted_at", "accepted_by"]
    search_fields = ["email", "tenant__slug"]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "tenant", "role", "joined_at"]
    list_filter = ["role"]
    search_fields = ["user__email", "tenant__slug"]


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ["id", "tenant", "status", "worker", "created_at", "finished_at"]
    list_filter = ["status"]


@admin.register(KVFile)
class KVFileAdmin(admin.ModelAdmin):
    list_display = ["name", "tenant", "worker", "tokens", "residency", "pinned", "synced_at"]
    list_filter = ["residency", "pinned"]
    actions = ["evict"]

    @admin.action(description="Evict from worker memory (audited)")
    def evict(self, request, queryset) -> None:
        for kv in queryset.select_related("tenant"):
            try:
                kvfiles.staff_evict(kv, request.user)
            except kvfiles.WorkerUnavailable as exc:
                self.message_user(request, f"{kv.name}: {exc}", messages.ERROR)


admin.site.register([Program, ProgramVersion, UsageRecord, AuditLog, QuotaNotice])


@admin.register(MonthlyTokens)
class MonthlyTokensAdmin(admin.ModelAdmin):
    """Each tenant's tokens per month, for reading: the database keeps them from the usage rows
    (migration 0028), so an edit here would only disagree with those rows."""

    list_display = ("tenant", "month", "tokens")
    list_filter = ("month",)
    search_fields = ("tenant__slug",)

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


User = get_user_model()
admin.site.unregister(User)


@admin.register(User)
class SymphonyUserAdmin(UserAdmin):
    """Django's user admin, plus mailing someone a password-reset link (staff never see or set
    a user's password in clear; the link lets its owner choose one)."""

    actions = ["mail_password_reset"]

    @admin.action(description="Mail a password-reset link")
    def mail_password_reset(self, request, queryset) -> None:
        users = list(queryset.filter(is_active=True).exclude(email=""))
        try:
            for user in users:
                mail.request_password_reset(user.email)
        except mail.MailUnavailable as exc:
            self.message_user(request, str(exc), level=messages.ERROR)
            return
        self.message_user(request, f"password-reset link queued for {len(users)} user(s) (one per address a minute)")
