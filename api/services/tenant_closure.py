"""Closing a tenant: an owner ends it, and its data is deleted.

Closing happens at once, in one transaction, so nothing can use the tenant afterwards: the tenant
is marked closed, its API keys and pending invitations are revoked, its queued and running runs
are cancelled (running programs are stopped through api/services/cancellation.py), and every
membership ends, so the console drops it from everyone's tenant list.

Deleting the data comes after, in Celery tasks, because it needs the workers and must wait for the
cancelled runs to finish:

* :func:`purge_kv_files` runs on every worker host (its queue ``worker.<name>``): it deletes the
  tenant's KV files from that worker's device, host memory and KV store over the admin socket.
  Hosts that are down get the task when their executor comes back (the broker keeps it).
* :func:`purge` deletes the programs, their versions, the runs (arguments, results, output) and
  their event streams, the API keys and invitations, once every cancelled run has recorded its
  usage (:class:`PurgePending` until then).

What stays is what the operator needs to bill and to answer for what happened: the tenant row
(name, slug, plan, ``closed_at``), its usage records (invoices keep working for staff) and its
audit log. A closed tenant's slug is never reused, so its KV namespace on the workers is never
inherited by another tenant.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from api import dispatch
from api.models import ApiKey, AuditLog, Invitation, KVFile, Membership, Program, Run, StoredResponse, Tenant
from api.services import kvfiles, routing
from api.services.members import OWNER, NotAllowed
from api.services.quotas import plan_limits
from api.services.runs import RunConflict, cancel_run, delete_runs, unsettled

log = logging.getLogger(__name__)

ACTIVE = ("queued", "running")


class ConfirmationMismatch(Exception):
    """The ``confirm`` field is not the tenant's slug: HTTP 400 (nothing was changed)."""


class TenantClosed(Exception):
    """The tenant was closed already: HTTP 409."""


class PurgePending(Exception):
    """Cancelled runs of the closed tenant are still finishing: retry the purge later."""


@dataclass(frozen=True)
class ClosureReport:
    keys_revoked: int
    invitations_revoked: int
    runs_cancelled: int
    members_removed: int


@dataclass(frozen=True)
class PurgeReport:
    programs: int
    runs: int
    api_keys: int
    invitations: int


def close(actor, tenant: Tenant, confirm: str, *, by_staff: bool = False) -> ClosureReport:
    """Close ``tenant`` on behalf of ``actor``: an owner, who confirms by typing its slug, or
    (``by_staff``) an operator ending an abusive or unpaid tenant from the Django admin.

    The tenant row, keys, invitations and memberships change in one transaction. Its runs are
    cancelled once that has committed (cancelling tells executors through Redis, which a rolled
    back close must not have done); none can start in between, as start_run refuses a closed
    tenant. Then the purge is enqueued."""
    with transaction.atomic():
        tenant = Tenant.objects.select_for_update().get(pk=tenant.pk)  # team changes wait for this
        if tenant.closed_at is not None:
            raise TenantClosed("this tenant is already closed")
        if by_staff:
            if not actor.is_staff:
                raise NotAllowed("only staff can close a tenant they do not own")
        elif Membership.objects.filter(user=actor, tenant=tenant).values_list("role", flat=True).first() != OWNER:
            raise NotAllowed("only an owner can close a tenant")
        if confirm != tenant.slug:
            raise ConfirmationMismatch(f"type the tenant's slug ({tenant.slug}) to confirm closing it")
        now = timezone.now()
        tenant.closed_at = now
        tenant.allowed_tool_hosts = []
        tenant.save(update_fields=["closed_at", "allowed_tool_hosts"])
        keys = ApiKey.objects.filter(tenant=tenant, revoked_at__isnull=True).update(revoked_at=now)
        invitations = Invitation.objects.filter(
            tenant=tenant, accepted_at__isnull=True, revoked_at__isnull=True
        ).update(revoked_at=now)
        members = list(Membership.objects.filter(tenant=tenant).select_related("user"))
        AuditLog.objects.create(
            actor=actor,
            tenant=tenant,
            action="tenant.close",
            target=tenant.slug,
            detail={
                "keys_revoked": keys,
                "invitations_revoked": invitations,
                "active_runs": Run.objects.filter(tenant=tenant, status__in=ACTIVE).count(),
                "members_removed": [m.user.email for m in members],
                "by_staff": by_staff,
            },
        )
        Membership.objects.filter(tenant=tenant).delete()
    cancelled = _cancel_active_runs(tenant)
    transaction.on_commit(lambda: schedule_purge(tenant))  # at once, unless a caller's transaction is open
    log.info("tenant_closed tenant=%s by=%s runs_cancelled=%d", tenant.slug, actor.pk, cancelled)
    return ClosureReport(keys, invitations, cancelled, len(members))


def _cancel_active_runs(tenant: Tenant) -> int:
    cancelled = 0
    for run in Run.objects.filter(tenant=tenant, status__in=ACTIVE):
        try:
            cancel_run(run)
            cancelled += 1
        except RunConflict:
            pass  # it ended meanwhile
    return cancelled


def kv_workers(tenant: Tenant) -> set[str]:
    """Every worker that may hold the tenant's KV files: the live ones (files written since the
    last listing), those the mirror names (down now, back later) and the local one."""
    names = {w.name for w in routing.live_workers()}
    names.update(KVFile.objects.filter(tenant=tenant).values_list("worker", flat=True))
    names.add(settings.SYMPHONY_WORKER_NAME)
    return names


def schedule_purge(tenant: Tenant) -> None:
    """Enqueue the data purge and one KV purge per worker host."""
    for worker in sorted(kv_workers(tenant)):
        dispatch.task(dispatch.PURGE_TENANT_KV).apply_async(args=[tenant.pk], queue=f"worker.{worker}")
    dispatch.task(dispatch.PURGE_TENANT).delay(tenant.pk)


def purge_kv_files(tenant_id: int) -> int:
    """Delete a closed tenant's KV files from this host's worker (and its KV store) and their
    mirror rows; returns how many were deleted. Raises kvfiles.WorkerUnavailable to be retried."""
    tenant = Tenant.objects.get(pk=tenant_id, closed_at__isnull=False)
    deleted = kvfiles.delete_all(tenant)
    log.info("tenant_kv_purged tenant=%s worker=%s files=%d", tenant.slug, settings.SYMPHONY_WORKER_NAME, deleted)
    return deleted


def purge(tenant_id: int) -> PurgeReport:
    """Delete a closed tenant's programs, runs, keys and invitations (PurgePending while any of
    its runs is still finishing). Idempotent: a second call deletes nothing and reports zeros."""
    tenant = Tenant.objects.get(pk=tenant_id, closed_at__isnull=False)
    _cancel_active_runs(tenant)  # one created in the moment the tenant closed
    pending = unsettled(Run.objects.filter(tenant=tenant), plan_limits(tenant).max_run_seconds).count()
    if pending:
        raise PurgePending(f"{pending} run(s) of tenant {tenant.slug} are still finishing")
    with transaction.atomic():
        StoredResponse.objects.filter(tenant=tenant).delete()  # /v1/responses turns: user content
        runs = delete_runs(Run.objects.filter(tenant=tenant))
        programs = Program.objects.filter(tenant=tenant).delete()[1].get("api.Program", 0)
        keys = ApiKey.objects.filter(tenant=tenant).delete()[1].get("api.ApiKey", 0)
        invitations = Invitation.objects.filter(tenant=tenant).delete()[1].get("api.Invitation", 0)
        Tenant.objects.filter(pk=tenant.pk).update(purged_at=timezone.now())
    report = PurgeReport(programs=programs, runs=runs, api_keys=keys, invitations=invitations)
    log.info("tenant_purged tenant=%s %s", tenant.slug, report)
    return report
