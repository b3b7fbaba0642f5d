from django.urls import path, re_path
from rest_framework.routers import SimpleRouter

from api.health import HealthView
from api.views import auth, keys, kv, programs, run_trace, runs, staff, staff_tenants, team, tool_hosts, usage
from api.views.run_events import run_events

router = SimpleRouter(trailing_slash=False)
router.register("api-keys", keys.ApiKeyViewSet, basename="api-key")
router.register("programs", programs.ProgramViewSet, basename="program")
router.register("runs", runs.RunViewSet, basename="run")
router.register("kv-files", kv.KVFileViewSet, basename="kv-file")
router.register("members", team.MemberViewSet, basename="member")
router.register("invitations", team.InvitationViewSet, basename="invitation")
router.register("audit-log", team.AuditLogViewSet, basename="audit-log")

staff_router = SimpleRouter(trailing_slash=False)
staff_router.register("admin/kv-files", staff.StaffKVFileViewSet, basename="admin-kv-file")

urlpatterns = [
    path("health", HealthView.as_view(), name="health"),
    path("auth/signup", auth.SignupView.as_view(), name="auth-signup"),
    path("auth/login", auth.LoginView.as_view(), name="auth-login"),
    path("auth/logout", auth.LogoutView.as_view(), name="auth-logout"),
    path("auth/me", auth.MeView.as_view(), name="auth-me"),
    path("auth/switch-tenant", auth.SwitchTenantView.as_view(), name="auth-switch-tenant"),
    path("auth/csrf", auth.CsrfView.as_view(), name="auth-csrf"),
    path("auth/password", auth.PasswordChangeView.as_view(), name="auth-password"),
    path("auth/email", auth.EmailChangeView.as_view(), name="auth-email"),
    path("auth/email/confirm", auth.EmailChangeConfirmView.as_view(), name="auth-email-confirm"),
    path("auth/password-reset", auth.PasswordResetRequestView.as_view(), name="auth-password-reset"),
    path("auth/verify-email", auth.VerifyEmailView.as_view(), name="auth-verify-email"),
    path("auth/verify-email/resend", auth.VerifyEmailResendView.as_view(), name="auth-verify-email-resend"),
    path(
        "auth/password-reset/confirm",
        auth.PasswordResetConfirmView.as_view(),
        name="auth-password-reset-confirm",
    ),
    path("auth/invitations/<str:token>", team.InvitationPreviewView.as_view(), name="auth-invitation"),
    path("auth/invitations/<str:token>/accept", team.InvitationAcceptView.as_view(), name="auth-invitation-accept"),
    path("tenants", team.TenantCreateView.as_view(), name="tenants"),
    path("tenants/<int:tenant_id>/close", team.TenantCloseView.as_view(), name="tenant-close"),
    path("runs/<uuid:run_id>/events", run_events, name="run-events"),
    path("runs/<uuid:run_id>/trace", run_trace.RunTraceView.as_view(), name="run-trace"),
    path("usage", usage.UsageView.as_view(), name="usage"),
    path("admin/tenants", staff.StaffTenantListView.as_view(), name="admin-tenants"),
    path("admin/tenants/<int:tenant_id>", staff_tenants.StaffTenantDetailView.as_view(), name="admin-tenant"),
    path(
        "admin/tenants/<int:tenant_id>/close",
        staff_tenants.StaffTenantCloseView.as_view(),
        name="admin-tenant-close",
    ),
    path("admin/plans", staff_tenants.StaffPlansView.as_view(), name="admin-plans"),
    path("admin/workers", staff.StaffWorkersView.as_view(), name="admin-workers"),
    path("staff/workers/<str:name>/timeline", staff.StaffWorkerTimelineView.as_view(), name="staff-worker-timeline"),
    path("invoices", usage.InvoiceListView.as_view(), name="invoices"),
    re_path(r"^invoices/(?P<month>\d{4}-(?:0[1-9]|1[0-2]))$", usage.InvoiceDetailView.as_view(), name="invoice"),
    path("quota", usage.QuotaView.as_view(), name="quota"),
    path("tool-hosts", tool_hosts.ToolHostsView.as_view(), name="tool-hosts"),
    *router.urls,
    *staff_router.urls,
]
