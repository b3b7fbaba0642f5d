from django.urls import path, re_path
from rest_framework.routers import SimpleRouter

from api import views
from api.events import run_events
from api.health import HealthView

router = SimpleRouter(trailing_slash=False)
router.register("api-keys", views.ApiKeyViewSet, basename="api-key")
router.register("programs", views.ProgramViewSet, basename="program")
router.register("runs", views.RunViewSet, basename="run")
router.register("kv-files", views.KVFileViewSet, basename="kv-file")
router.register("members", views.MemberViewSet, basename="member")
router.register("invitations", views.InvitationViewSet, basename="invitation")
router.register("audit-log", views.AuditLogViewSet, basename="audit-log")

staff_router = SimpleRouter(trailing_slash=False)
staff_router.register("admin/kv-files", views.StaffKVFileViewSet, basename="admin-kv-file")

urlpatterns = [
    path("health", HealthView.as_view(), name="health"),
    path("auth/signup", views.SignupView.as_view(), name="auth-signup"),
    path("auth/login", views.LoginView.as_view(), name="auth-login"),
    path("auth/logout", views.LogoutView.as_view(), name="auth-logout"),
    path("auth/me", views.MeView.as_view(), name="auth-me"),
    path("auth/switch-tenant", views.SwitchTenantView.as_view(), name="auth-switch-tenant"),
    path("auth/csrf", views.CsrfView.as_view(), name="auth-csrf"),
    path("auth/password", views.PasswordChangeView.as_view(), name="auth-password"),
    path("auth/email", views.EmailChangeView.as_view(), name="auth-email"),
    path("auth/email/confirm", views.EmailChangeConfirmView.as_view(), name="auth-email-confirm"),
    path("auth/password-reset", views.PasswordResetRequestView.as_view(), name="auth-password-reset"),
    path(
        "auth/password-reset/confirm",
        views.PasswordResetConfirmView.as_view(),
        name="auth-password-reset-confirm",
    ),
    path("auth/invitations/<str:token>", views.InvitationPreviewView.as_view(), name="auth-invitation"),
    path("auth/invitations/<str:token>/accept", views.InvitationAcceptView.as_view(), name="auth-invitation-accept"),
    path("tenants", views.TenantCreateView.as_view(), name="tenants"),
    path("tenants/<int:tenant_id>/close", views.TenantCloseView.as_view(), name="tenant-close"),
    path("runs/<uuid:run_id>/events", run_events, name="run-events"),
    path("usage", views.UsageView.as_view(), name="usage"),
    path("admin/tenants", views.StaffTenantsView.as_view(), name="admin-tenants"),
    path("admin/workers", views.StaffWorkersView.as_view(), name="admin-workers"),
    path("invoices", views.InvoiceListView.as_view(), name="invoices"),
    re_path(r"^invoices/(?P<month>\d{4}-(?:0[1-9]|1[0-2]))$", views.InvoiceDetailView.as_view(), name="invoice"),
    path("quota", views.QuotaView.as_view(), name="quota"),
    *router.urls,
    *staff_router.urls,
]
