"""Celery tasks of the control plane. Tasks stay thin: business logic lives in api/services."""

import logging
import os
import threading
import time

from celery import shared_task
from celery.signals import celeryd_after_setup, worker_ready, worker_shutdown

from api import dispatch

log = logging.getLogger(__name__)


#: How often a Celery worker reaps this host's leftover sandboxes (``SYMPHONY_SANDBOX_REAP_EVERY_S``).
REAP_EVERY_S = float(os.environ.get("SYMPHONY_SANDBOX_REAP_EVERY_S") or 60)


def _reap_sandboxes() -> None:
    try:
        from sandbox.reaper import reap

        reap()
    except Exception as exc:  # docker down: runs will fail with a clear error instead
        log.warning("sandbox_reap_skipped error=%s", exc)


def _reap_forever() -> None:
    while True:
        time.sleep(REAP_EVERY_S)
        _reap_sandboxes()


@worker_ready.connect
def reap_leftover_sandboxes(**_kwargs) -> None:
    """A Celery worker that (re)starts removes sandbox containers a crashed executor on this
    host left behind (their launcher pid is gone, or their deadline passed), then keeps doing so
    every ``REAP_EVERY_S``: a container whose removal failed (dockerd restarted under its run)
    is found once it has been stopped for a while. Beat cannot do this: it runs on one host, and
    each host has its own dockerd."""
    _reap_sandboxes()
    threading.Thread(target=_reap_forever, name="sandbox-reaper", daemon=True).start()


@celeryd_after_setup.connect
def record_executor_slots(sender: str, instance, **_kwargs) -> None:
    """The executor's slots (its concurrency), measured before its pool starts, bound how many
    of them one account may hold (api/services/executor_slots.py)."""
    from api.services import executor_slots

    pool_cls = instance.pool_cls
    module = pool_cls.__module__ if isinstance(pool_cls, type) else str(pool_cls)
    executor_slots.record_capacity(sender, instance.concurrency, module)


@worker_ready.connect
def announce_executor(sender, **_kwargs) -> None:
    """This executor heartbeats for the gpu_workers whose ``worker.<name>`` queue it consumes:
    routing sends runs only to a worker with a live executor (api/services/executor_presence.py)."""
    from api.services import executor_presence

    controller = getattr(sender, "controller", None)
    slots = 1 if controller is None else (1 if "solo" in str(controller.pool_cls) else controller.concurrency)
    queues = list(sender.app.amqp.queues.consume_from or sender.app.amqp.queues)
    if executor_presence.start_presence(queues, sender.hostname, slots) is not None:
        threading.Thread(target=_reroute_forever, name="stranded-run-reaper", daemon=True).start()


def _reroute_forever() -> None:
    """Every live executor re-routes runs stranded on a worker that cannot take them (one at a
    time, by an advisory lock): the reaping goes on as long as any executor lives, whichever
    executor (or beat's queue consumer) died."""
    from django.db import connection

    from api.services import executor_presence
    from api.services.runs import reroute_stranded

    while True:
        time.sleep(executor_presence.REAP_PERIOD_S)
        try:
            reroute_stranded()
        except Exception as exc:  # the database or Redis is away: the next round tries again
            log.warning("stranded_run_reroute_failed error=%s", exc)
        finally:
            connection.close()


@worker_shutdown.connect
def withdraw_executor(**_kwargs) -> None:
    """A clean stop (a drained worker's executor) leaves routing at once."""
    from api.services import executor_presence

    executor_presence.stop_presence()


@shared_task(name="api.ping")
def ping(payload: str = "pong") -> dict[str, str]:
    """Round-trip probe used by health checks and tests to prove a worker consumes the broker."""
    import socket

    return {"payload": payload, "hostname": socket.gethostname()}


@shared_task(name=dispatch.RUN_LIP, acks_late=True)
def run_lip(run_id: str, worker: str | None = None, attempt: int = 0) -> str:
    """Execute one run on this worker; see api/services/execution.py. Idempotent: a run that is
    not queued any more (already started, cancelled), or was re-routed to a worker other than
    ``worker`` (the one this task was sent to), is left alone. ``attempt`` counts re-routes.
    A run whose account holds its share of this executor's slots is sent back to the queue
    instead, still queued (api/services/executor_slots.py)."""
    from api.services.executor_slots import run_in_slot

    return run_in_slot(run_id, worker, attempt)


@shared_task(name="api.reap_orphaned_runs")
def reap_orphaned_runs() -> dict[str, int]:
    """Periodic (Celery beat): fail runs of dead workers, re-route runs queued on them."""
    from api.services.runs import reap_orphaned_runs as reap

    return reap()


@shared_task(name=dispatch.KV_ADMIN)
def kv_admin(op: str, args: dict) -> dict:
    """On a worker host (queue ``worker.<name>``): a KV admin operation on this host's
    gpu_worker, for a control plane on another host (api/services/kvfiles.py); ``args`` is the
    op's wire map (``gpu_worker.protocol.ADMIN_OPS``)."""
    from api.services.kvfiles import run_locally

    return run_locally(op, args)


@shared_task(name="api.meter_kv_storage")
def meter_kv_storage() -> int:
    """Periodic (Celery beat): bill stored KV files for the current period."""
    from api.services.billing import meter_kv_storage as meter

    return meter()


@shared_task(name="api.expire_response_kv")
def expire_response_kv() -> int:
    """Remove the KV files of stored /v1/responses conversations past their plan's TTL."""
    from api.services import responses

    return responses.expire_kv()


@shared_task(name="api.expire_finished_streams")
def expire_finished_streams() -> int:
    """Periodic (Celery beat): retention for finished runs' event streams that have none."""
    from api.services.runs import expire_finished_streams as expire

    return expire()


#: How long the purge of a closed tenant waits for its cancelled runs to record their usage.
PURGE_RETRY_S = 30


@shared_task(name=dispatch.PURGE_TENANT, bind=True, max_retries=240)
def purge_tenant(self, tenant_id: int) -> dict[str, int]:
    """Delete a closed tenant's programs, runs, keys and invitations (api/services/tenant_closure.py),
    retried every PURGE_RETRY_S while its cancelled runs are still finishing."""
    from dataclasses import asdict

    from api.services.tenant_closure import PurgePending, purge

    try:
        return asdict(purge(tenant_id))
    except PurgePending as exc:
        log.info("tenant_purge_waiting tenant=%s reason=%s", tenant_id, exc)
        raise self.retry(exc=exc, countdown=PURGE_RETRY_S) from exc


@shared_task(name=dispatch.PURGE_TENANT_KV, bind=True, max_retries=None)
def purge_tenant_kv(self, tenant_id: int) -> int:
    """On a worker host (queue ``worker.<name>``): delete a closed tenant's KV files from this
    host's gpu_worker, retried with backoff (up to 10 minutes apart) while it is unreachable."""
    from api.services.kvfiles import WorkerUnavailable
    from api.services.tenant_closure import purge_kv_files

    try:
        return purge_kv_files(tenant_id)
    except WorkerUnavailable as exc:
        raise self.retry(exc=exc, countdown=min(600, 10 * 2**self.request.retries)) from exc


#: Mail tasks retry an SMTP server that is down or refusing for about half an hour (backoff
#: 30 s, 60 s, ... capped at 10 minutes) before giving up with an error in the log.
_MAIL_RETRY = {
    "autoretry_for": (OSError,),  # smtplib.SMTPException is an OSError, and so are timeouts
    "retry_backoff": 30,
    "retry_backoff_max": 600,
    "retry_jitter": True,
    "max_retries": 6,
}


@shared_task(name=dispatch.SEND_PASSWORD_RESET_MAIL, **_MAIL_RETRY)
def send_password_reset_mail(email: str) -> int:
    """Mail a password-reset link to the accounts using ``email`` (none: nothing is sent)."""
    from api.services.mail import send_password_reset

    return send_password_reset(email)


@shared_task(name=dispatch.SEND_PASSWORD_CHANGED_MAIL, **_MAIL_RETRY)
def send_password_changed_mail(user_id: int) -> bool:
    """Tell a user their password changed."""
    from api.services.mail import send_password_changed

    return send_password_changed(user_id)


@shared_task(name=dispatch.SEND_INVITATION_MAIL, **_MAIL_RETRY)
def send_invitation_mail(invitation_id: int, token: str) -> bool:
    """Mail an invitee their invitation link (not if it was revoked or used meanwhile)."""
    from api.services.mail import send_invitation

    return send_invitation(invitation_id, token)


@shared_task(name=dispatch.SEND_EMAIL_CHANGE_MAIL, **_MAIL_RETRY)
def send_email_change_mail(new_email: str, token: str) -> bool:
    """Mail the link that confirms a new sign-in address to that address."""
    from api.services.mail import send_email_change

    return send_email_change(new_email, token)


@shared_task(name=dispatch.SEND_EMAIL_CHANGED_MAIL, **_MAIL_RETRY)
def send_email_changed_mail(old_email: str, new_email: str) -> bool:
    """Tell the old address that the account now signs in with another."""
    from api.services.mail import send_email_changed

    return send_email_changed(old_email, new_email)


@shared_task(name=dispatch.SEND_VERIFICATION_MAIL, **_MAIL_RETRY)
def send_verification_mail(email: str, token: str) -> bool:
    """Mail a new sign-up the link that verifies its address."""
    from api.services.mail import send_verification

    return send_verification(email, token)


@shared_task(name=dispatch.SEND_QUOTA_NOTICE_MAIL, **_MAIL_RETRY)
def send_quota_notice_mail(notice_id: int) -> int:
    """Tell a tenant's owners that its usage crossed a share of its monthly quota."""
    from api.services.mail import send_quota_notice

    return send_quota_notice(notice_id)
