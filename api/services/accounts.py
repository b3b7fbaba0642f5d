"""A person's own account: setting a new password through a reset link, and changing the email
address they sign in with.

A reset link (mailed by api/services/mail.py) carries Django's token, bound to the old password's
hash: the link works once, and every session signed in with the old password ends with it.

The new address must prove it is theirs before it replaces the old one: the request mails a link
to the new address, and only opening it makes the change. The link's token is signed (Django's
``signing`` under ``SECRET_KEY``), valid ``EMAIL_CHANGE_MAX_AGE_S``, and names the address it
replaces, so it works once: after the change, or any other change, it no longer matches. The old
address is told afterwards, so a change nobody asked for is noticed.

The email is also the username (sign-in, invitations bound to an address), and both change
together. API keys and memberships belong to the user, not the address, and are unaffected.

An address given at sign-up is unverified (``UnverifiedEmail``) until the link mailed to it is
opened: the same signed, expiring kind of token, naming the address it verifies, so a link works
once. Until then the account may not mint API keys, start runs or upload programs
(:func:`require_verified`). A completed reset also proves the address, and ends what anyone who
held the account before did with it: every session, and (unless the owner keeps them) every API
key they minted before it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.contrib.auth.tokens import default_token_generator
from django.core import signing
from django.db import IntegrityError, transaction
from django.utils.encoding import force_str
from django.utils.http import urlsafe_base64_decode

from api.models import ApiKey, UnverifiedEmail
from api.services import keys, login_lockout, mail

log = logging.getLogger(__name__)

#: How long an email-change link stays valid.
EMAIL_CHANGE_MAX_AGE_S = 24 * 3600
_SALT = "symphony.accounts.email-change"
#: How long a sign-up's verification link stays valid.
VERIFY_MAX_AGE_S = mail.VERIFY_LINK_HOURS * 3600
_VERIFY_SALT = "symphony.accounts.verify-email"
#: One verification mail per account per this many seconds, however often "resend" is pressed.
RESEND_INTERVAL_S = 60


class WrongPassword(Exception):
    pass


class ResetLinkInvalid(Exception):
    """A password-reset link that is malformed, used, or past ``PASSWORD_RESET_TIMEOUT``."""


class EmailTaken(Exception):
    """Another account signs in with that address."""


class EmailChangeLinkInvalid(Exception):
    """A link that is malformed, expired, already used, or replaced by a later change."""


class VerifyLinkInvalid(Exception):
    """A verification link that is malformed, expired, already used or for an older address."""


class EmailUnverified(Exception):
    """The account has not opened the link mailed to its address yet: HTTP 403 ``email_unverified``."""

    def __init__(self, email: str) -> None:
        super().__init__(
            f"verify your email address first: open the link we mailed to {email} "
            "(POST /api/v1/auth/verify-email/resend sends another)"
        )


@dataclass(frozen=True)
class EmailChange:
    user_id: int
    old_email: str
    new_email: str


def login_name(identifier: str) -> str:
    """The username to authenticate a sign-in typed as ``identifier``: a username as it is
    (``admin``, made by ``make up``), else as console sign-ups store it (their email,
    lowercased), else the username of the one account whose email address it is
    (``admin@localhost``). Unknown input comes back lowercased, and authentication fails."""
    typed = identifier.strip()
    users = get_user_model().objects
    for candidate in dict.fromkeys((typed, typed.lower())):
        if users.filter(username=candidate).exists():
            return candidate
    if "@" in typed:
        owners = list(users.filter(email__iexact=typed).values_list("username", flat=True)[:2])
        if len(owners) == 1:
            return owners[0]
    return typed.lower()


@transaction.atomic
def reset_password(uid: str, token: str, new_password: str, revoke_api_keys: bool = True):
    """Set a new password through a reset link; returns the user.

    The new password ends every session (Django's session hash changes with it). The link proves
    the address, so the account is verified, and its sign-in lockout ends. ``revoke_api_keys``:
    also revoke every live key the user minted before now, each audited: whoever held the
    account (an attacker who signed up with this address first, or guessed the password) keeps
    no key. With False the keys stay, and that choice is audited per key.

    Raises ResetLinkInvalid for a bad, used or expired link, and Django's ValidationError for a
    password the validators refuse."""
    User = get_user_model()
    try:
        user = User.objects.get(pk=force_str(urlsafe_base64_decode(uid)), is_active=True)
    except (ValueError, TypeError, OverflowError, User.DoesNotExist):
        user = None
    if user is None or not default_token_generator.check_token(user, token):
        raise ResetLinkInvalid("this reset link is invalid, was already used or has expired: ask for a new one")
    validate_password(new_password, user)
    user.set_password(new_password)
    user.save(update_fields=["password"])
    UnverifiedEmail.objects.filter(user=user).delete()
    live = ApiKey.objects.filter(created_by=user, revoked_at__isnull=True).select_related("tenant")
    for key in live:
        if revoke_api_keys:
            keys.revoke_by(user, key, reason="password_reset")
        else:
            keys.audit(user, key, "api_key.kept_after_reset")
    login_lockout.clear(user.get_username())
    log.info("password_reset user=%s revoke_api_keys=%s", user.pk, revoke_api_keys)
    return user


# --- email verification -----------------------------------------------------------------------


def is_verified(user) -> bool:
    """False only for a user who signed up and has not opened their link; an API key's
    principal is verified (only a verified user can mint a key)."""
    if user is None or not getattr(user, "pk", None):
        return True
    return not UnverifiedEmail.objects.filter(user_id=user.pk).exists()


def require_verified(user) -> None:
    """Raise :class:`EmailUnverified` unless :func:`is_verified`."""
    if not is_verified(user):
        raise EmailUnverified(user.email)


def verification_token(user) -> str:
    return signing.dumps({"user": user.pk, "email": user.email.lower()}, salt=_VERIFY_SALT)


def start_verification(user) -> None:
    """Mark a new sign-up unverified and mail it the link (after the sign-up commits). A
    broker outage does not fail the sign-up: "resend" mails it later."""
    UnverifiedEmail.objects.get_or_create(user=user)
    token = verification_token(user)
    transaction.on_commit(lambda: mail.queue_verification(user.email, token))


def resend_verification(user) -> bool:
    """Mail the link again, at most once per ``RESEND_INTERVAL_S`` per account; False when the
    account is already verified or a mail went out within the interval. Raises
    mail.MailUnavailable when the mail could not be queued."""
    if is_verified(user):
        return False
    if not mail.first_in_interval(f"mail:verify:{user.pk}", RESEND_INTERVAL_S):
        return False
    try:
        mail.queue_verification_strict(user.email, verification_token(user))
    except mail.MailUnavailable:
        mail.forget_interval(f"mail:verify:{user.pk}")
        raise
    return True


@transaction.atomic
def verify_email(token: str):
    """Open a verification link; returns the user. Works once: the pending mark is deleted, and
    a link for an address the account no longer uses is refused."""
    try:
        data = signing.loads(token, salt=_VERIFY_SALT, max_age=VERIFY_MAX_AGE_S)
        user_id, email = int(data["user"]), str(data["email"])
    except (signing.BadSignature, KeyError, TypeError, ValueError) as exc:
        raise VerifyLinkInvalid("this verification link is invalid or has expired: ask for a new one") from exc
    User = get_user_model()
    user = User.objects.select_for_update().filter(pk=user_id, is_active=True).first()
    if user is None or user.email.lower() != email:
        raise VerifyLinkInvalid("this verification link is for an address the account no longer uses")
    deleted, _ = UnverifiedEmail.objects.filter(user=user).delete()
    if not deleted:
        raise VerifyLinkInvalid("this verification link was already used: the address is verified")
    log.info("email_verified user=%s", user.pk)
    return user


def _taken(email: str, user) -> bool:
    return get_user_model().objects.filter(username__iexact=email).exclude(pk=user.pk).exists()


def request_email_change(user, new_email: str, password: str) -> str:
    """Mail a confirmation link to ``new_email`` (the signed-in user's password confirms it is
    them asking); returns the address as it will be stored. Raises WrongPassword, EmailTaken,
    or mail.MailUnavailable."""
    if not user.check_password(password):
        raise WrongPassword("wrong password")
    new_email = new_email.strip().lower()
    if new_email == user.email.lower():
        raise EmailTaken("that is already your email address")
    if _taken(new_email, user):
        raise EmailTaken("another account uses that email address")
    token = signing.dumps({"user": user.pk, "old": user.email.lower(), "new": new_email}, salt=_SALT)
    mail.queue_email_change(new_email, token)
    log.info("email_change_requested user=%s", user.pk)
    return new_email


def read_link(token: str) -> EmailChange:
    """What a link would change, if it is still good; EmailChangeLinkInvalid otherwise."""
    try:
        data = signing.loads(token, salt=_SALT, max_age=EMAIL_CHANGE_MAX_AGE_S)
        change = EmailChange(int(data["user"]), str(data["old"]), str(data["new"]))
    except (signing.BadSignature, KeyError, TypeError, ValueError) as exc:
        raise EmailChangeLinkInvalid("this link is invalid or has expired: ask for a new one") from exc
    return change


@transaction.atomic
def confirm_email_change(token: str):
    """Make the change a link asks for; returns the user. The row is locked so two clicks of
    one link change it once."""
    change = read_link(token)
    User = get_user_model()
    user = User.objects.select_for_update().filter(pk=change.user_id, is_active=True).first()
    if user is None or user.email.lower() != change.old_email:
        raise EmailChangeLinkInvalid("this link was already used, or the address changed since: ask for a new one")
    if _taken(change.new_email, user):
        raise EmailTaken("another account uses that email address")
    user.email = user.username = change.new_email
    try:
        with transaction.atomic():
            user.save(update_fields=["email", "username"])
    except IntegrityError as exc:  # an account signed up with it between the check and now
        raise EmailTaken("another account uses that email address") from exc
    UnverifiedEmail.objects.filter(user=user).delete()  # the link proved the new address
    transaction.on_commit(lambda: mail.queue_email_changed_notice(change.old_email, change.new_email))
    log.info("email_changed user=%s", user.pk)
    return user
