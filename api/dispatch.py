"""Enqueue the control plane's Celery tasks from api/services without importing api/tasks.py.

The tasks are thin wrappers that call api/services, and some services enqueue tasks (a new run
to its worker's queue, a closed tenant's purges, mail). A service importing ``api.tasks`` would
close an import cycle, so it looks the task up here by its registered name instead and gets the
same task object (``delay``, ``apply_async``, ``name``). api/tasks.py registers every task under
these names; the ``api`` app imports it at start-up (api/apps.py), so the lookup never misses.
"""

from __future__ import annotations

from celery import Task, current_app

RUN_LIP = "api.run_lip"
PURGE_TENANT = "api.purge_tenant"
PURGE_TENANT_KV = "api.purge_tenant_kv"
KV_ADMIN = "api.kv_admin"
SEND_PASSWORD_RESET_MAIL = "api.send_password_reset_mail"  # noqa: S105 - a task name, not a secret
SEND_PASSWORD_CHANGED_MAIL = "api.send_password_changed_mail"  # noqa: S105 - a task name, not a secret
SEND_INVITATION_MAIL = "api.send_invitation_mail"
SEND_EMAIL_CHANGE_MAIL = "api.send_email_change_mail"
SEND_EMAIL_CHANGED_MAIL = "api.send_email_changed_mail"
SEND_QUOTA_NOTICE_MAIL = "api.send_quota_notice_mail"
SEND_VERIFICATION_MAIL = "api.send_verification_mail"

#: Every name above: the tasks services may enqueue (a test checks api/tasks.py defines each).
NAMES = (
    RUN_LIP,
    PURGE_TENANT,
    PURGE_TENANT_KV,
    KV_ADMIN,
    SEND_PASSWORD_RESET_MAIL,
    SEND_PASSWORD_CHANGED_MAIL,
    SEND_INVITATION_MAIL,
    SEND_EMAIL_CHANGE_MAIL,
    SEND_EMAIL_CHANGED_MAIL,
    SEND_QUOTA_NOTICE_MAIL,
    SEND_VERIFICATION_MAIL,
)


def task(name: str) -> Task:
    """The registered task called ``name`` (one of the constants above)."""
    return current_app.tasks[name]
