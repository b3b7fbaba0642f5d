"""Mail the service sends to people: password-reset links, invitation links and the notice that a
password changed.

Each mail is sent by a Celery task on the housekeeping queue (api/tasks.py), never inside the
request: an SMTP server that is slow or down then costs a retry, not a hung page, and a reset
request takes the same time whether or not the address has an account (no account enumeration
by timing). The request side only queues (``request_password_reset``, ``queue_*``); the task
side builds and sends (``send_*``). Setting the password a reset link allows is
api/services/accounts.py.

Bodies are plain-text Django templates in api/templates/api/mail/; links point at the console
(``SYMPHONY_PUBLIC_URL``). Where mail goes is Django's email backend (``SYMPHONY_EMAIL_URL``:
SMTP, or files under var/mail/ by default).
"""

from __future__ import annotations

import hashlib
import logging
import smtplib

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.tokens import default_token_generator
from django.core.cache import cache
from django.core.mail import send_mail
from django.template.loader import render_to_string
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode
from kombu.exceptions import OperationalError

from api import dispatch
from api.models import Invitation, Membership, QuotaNotice
from api.services.keys import secret_digests
from api.services.quotas import next_period_start

log = logging.getLogger(__name__)

#: One reset mail per address per this many seconds, however many requests ask for one: the
#: per-client auth throttle stops one guesser, this stops many from flooding one inbox.
RESET_MAIL_INTERVAL_S = 60


class MailUnavailable(Exception):
    """The mail could not be queued (the Celery broker is down); nothing was sent."""


def public_link(path: str) -> str:
    """An absolute link to a console page, for a mail."""
    return settings.SYMPHONY_PUBLIC_URL + path


def _send(template: str, to: str, **context) -> bool:
    """Render api/mail/<template>.txt (first line: subject) and send it to one address.

    A refusal the server calls permanent (5xx: no such mailbox, sender not allowed) is logged and
    dropped, since retrying cannot change it; anything else (the server down, a 4xx, a timeout)
    propagates as an OSError for the task to retry."""
    subject, _, body = render_to_string(f"api/mail/{template}.txt", context).partition("\n")
    try:
        send_mail(subject.strip(), body.lstrip("\n"), None, [to])
    except smtplib.SMTPException as exc:
        if not is_permanent(exc):
            raise
        log.error("mail_refused template=%s to_hash=%s error=%s", template, _address_hash(to), exc)
        return False
    log.info("mail_sent template=%s to_hash=%s", template, _address_hash(to))
    return True


def is_permanent(exc: smtplib.SMTPException) -> bool:
    """Whether the SMTP server refused for good (a 5xx reply), as opposed to for now."""
    if isinstance(exc, smtplib.SMTPRecipientsRefused):
        return all(code >= 500 for code, _ in exc.recipients.values())
    return isinstance(exc, smtplib.SMTPResponseException) and exc.smtp_code >= 500


def _address_hash(email: str) -> str:
    """Logs and cache keys name an address by a digest, not in clear."""
    return hashlib.sha256(email.strip().lower().encode()).hexdigest()[:16]


def _enqueue(task, *args) -> None:
    try:
        task.delay(*args)
    except OperationalError as exc:
        log.error("mail_enqueue_failed task=%s error=%s", task.name, exc)
        raise MailUnavailable("mail cannot be sent right now; try again in a minute") from exc


def _enqueue_best_effort(task, *args) -> bool:
    """Queue a mail whose occasion has already happened (a changed password, a notice): a broker
    outage is logged and must not undo or fail it. False when nothing was queued."""
    try:
        _enqueue(task, *args)
    except MailUnavailable:
        return False
    return True


# --- password reset ---------------------------------------------------------------------------


def first_in_interval(key: str, interval_s: int) -> bool:
    """Whether no mail went out under ``key`` in the last ``interval_s`` seconds (and mark one
    now). A cache outage answers True: it must not stop people from getting their link."""
    try:
        return bool(cache.add(key, 1, timeout=interval_s))
    except Exception as exc:
        log.warning("mail_interval_unchecked error=%s", exc)
        return True


def forget_interval(key: str) -> None:
    """Nothing went out after all (the broker was down): a retry may ask again."""
    try:
        cache.delete(key)
    except Exception as exc:
        log.warning("mail_interval_not_reset error=%s", exc)


def request_password_reset(email: str) -> None:
    """Queue a reset mail for ``email``, at most one per address per ``RESET_MAIL_INTERVAL_S``.

    Answers the same whether or not an account uses the address: the task finds out."""
    interval_key = f"mail:reset:{_address_hash(email)}"
    if not first_in_interval(interval_key, RESET_MAIL_INTERVAL_S):
        return
    try:
        _enqueue(dispatch.task(dispatch.SEND_PASSWORD_RESET_MAIL), email.strip().lower())
    except MailUnavailable:
        forget_interval(interval_key)
        raise


def send_password_reset(email: str) -> int:
    """Mail a reset link to each active account with this email; how many were mailed."""
    users = get_user_model().objects.filter(email__iexact=email, is_active=True)
    sent = 0
    for user in users:
        if not user.has_usable_password():
            continue
        uid = urlsafe_base64_encode(force_bytes(user.pk))
        token = default_token_generator.make_token(user)
        sent += _send(
            "password_reset",
            user.email,
            link=public_link(f"/reset-password/{uid}/{token}"),
            minutes=settings.PASSWORD_RESET_TIMEOUT // 60,
        )
    return sent


# --- notices and invitations ------------------------------------------------------------------


def queue_password_changed(user) -> None:
    """Tell the account's owner their password changed (a reset or a change they did not make
    is then noticed). Best effort: the change itself has happened."""
    _enqueue_best_effort(dispatch.task(dispatch.SEND_PASSWORD_CHANGED_MAIL), user.pk)


def send_password_changed(user_id: int) -> bool:
    user = get_user_model().objects.filter(pk=user_id, is_active=True).first()
    if user is None or not user.email:
        return False
    return _send("password_changed", user.email, forgot_link=public_link("/forgot-password"))


def queue_invitation(invitation: Invitation, token: str) -> bool:
    """Queue the invitation mail; False when it could not be queued (the owner still has the
    link on screen to pass on)."""
    return _enqueue_best_effort(dispatch.task(dispatch.SEND_INVITATION_MAIL), invitation.pk, token)


def send_invitation(invitation_id: int, token: str) -> bool:
    """Mail the invitee their link, unless the invitation was revoked or used meanwhile, or the
    token is not this invitation's (a task that reached the wrong database mails nobody)."""
    invitation = (
        Invitation.objects.select_related("tenant", "invited_by")
        .filter(pk=invitation_id, accepted_at__isnull=True, revoked_at__isnull=True)
        .first()
    )
    if invitation is None or invitation.token_hash not in secret_digests(token):
        return False
    return _send(
        "invitation",
        invitation.email,
        tenant=invitation.tenant.name,
        role=invitation.role,
        inviter=invitation.invited_by.email if invitation.invited_by else "An owner",
        link=public_link(f"/invite/{token}"),
        expires_at=invitation.expires_at,
    )


# --- email verification (api/services/accounts.py) ---------------------------------------------


def queue_verification(email: str, token: str) -> bool:
    """Queue a new sign-up's verification link (best effort: the sign-up has happened, and
    ``resend`` asks again); False when nothing was queued."""
    return _enqueue_best_effort(dispatch.task(dispatch.SEND_VERIFICATION_MAIL), email, token)


def queue_verification_strict(email: str, token: str) -> None:
    """Queue a verification link someone asked for again (raises MailUnavailable)."""
    _enqueue(dispatch.task(dispatch.SEND_VERIFICATION_MAIL), email, token)


def send_verification(email: str, token: str) -> bool:
    return _send("verify_email", email, link=public_link(f"/verify-email/{token}"), hours=VERIFY_LINK_HOURS)


#: api/services/accounts.py VERIFY_MAX_AGE_S in hours (not imported: accounts imports this module).
VERIFY_LINK_HOURS = 48


# --- email address change (api/services/accounts.py) ---------------------------------------------


def queue_email_change(new_email: str, token: str) -> None:
    """Queue the link that confirms a new address (raises MailUnavailable: nothing changes then)."""
    _enqueue(dispatch.task(dispatch.SEND_EMAIL_CHANGE_MAIL), new_email, token)


def send_email_change(new_email: str, token: str) -> bool:
    return _send("email_change", new_email, link=public_link(f"/confirm-email/{token}"))


def queue_email_changed_notice(old_email: str, new_email: str) -> None:
    """Tell the old address it no longer signs in (best effort: the change has happened)."""
    _enqueue_best_effort(dispatch.task(dispatch.SEND_EMAIL_CHANGED_MAIL), old_email, new_email)


def send_email_changed(old_email: str, new_email: str) -> bool:
    return _send("email_changed", old_email, new_email=new_email)


# --- quota notices (api/services/quota_alerts.py) ------------------------------------------------


def queue_quota_notice(notice) -> None:
    """Queue the owners' mail for a quota notice (best effort: the notice row and audit entry
    stay either way)."""
    _enqueue_best_effort(dispatch.task(dispatch.SEND_QUOTA_NOTICE_MAIL), notice.pk)


def send_quota_notice(notice_id: int) -> int:
    """Mail the notice to each owner of its tenant; how many were mailed."""
    notice = QuotaNotice.objects.select_related("tenant").filter(pk=notice_id).first()
    if notice is None or notice.tenant.closed_at is not None:
        return 0
    owners = Membership.objects.filter(tenant=notice.tenant, role="owner", user__is_active=True).select_related("user")
    context = {
        "tenant": notice.tenant.name,
        "plan": notice.tenant.plan,
        "percent": notice.percent,
        "used": f"{notice.used:,}",
        "limit": f"{notice.limit:,}",
        "resets": next_period_start(notice.created_at.date()).isoformat(),
        "link": public_link("/usage"),
    }
    return sum(_send("quota_notice", m.user.email, **context) for m in owners if m.user.email)
