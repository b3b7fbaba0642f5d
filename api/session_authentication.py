"""Console sessions, read within their account's share of the web process's database connections.

Reading a request's Django session and its user takes a pooled database connection, as an API
key's lookup does (api/authentication.py). Read first and counted after, a flood of one
person's console requests, or of made-up session cookies, held every connection while their
reads waited, and another tenant's requests waited behind them. So the read takes its place in
a share first (api/services/db_share.py): the share of the account the session was last seen
signed in to (api/services/session_accounts.py), or of
:data:`~api.services.db_share.UNIDENTIFIED_SESSIONS` for a session not seen yet; past it the
request is refused at once with 429 ``throttled`` and Retry-After. Once the view knows its
tenant, DRF's ``AccountDbShareThrottle`` moves the place to the tenant's account.

:class:`ConsoleSessionAuthentication` does this for the DRF views; the plain async views (run
events over SSE) call :func:`console_user` and give the place back at once, since each of their
database calls returns its connection.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest
from rest_framework import authentication, exceptions

from api.db_admission import RETRY_AFTER_S, keep_lease
from api.models import user_account_key
from api.services import session_accounts
from api.services.db_share import AccountOverShare, DbShareLease, admit_session_read


def console_user_in_share(request: HttpRequest) -> tuple[Any, DbShareLease | None]:
    """The signed-in person of ``request``'s console session (``None``: no session cookie, or
    signed out), read within a place in the share, which the caller keeps when a person was
    found (``None`` without a pool, or when nothing was read). :class:`AccountOverShare` when
    the share is full: nothing was read."""
    if hasattr(request, "_cached_user"):  # read already (django.contrib.auth.middleware.get_user)
        user = request._cached_user
        return (user if user.is_authenticated else None), None
    session_key = request.COOKIES.get(settings.SESSION_COOKIE_NAME)
    if not session_key:  # nothing to read: the user is anonymous without the database
        return None, None
    account = session_accounts.remembered(session_key)
    lease = admit_session_read(account)
    try:
        user = request.user  # the session's row, then its user's
        signed_in = bool(user and user.is_authenticated and user.is_active)
    except BaseException:
        if lease is not None:
            lease.release()
        raise
    if not signed_in:
        if lease is not None:
            lease.release()
        return None, None
    mine = user_account_key(user.pk)
    if account != mine:
        session_accounts.remember(session_key, mine)
    return user, lease


def console_user(request: HttpRequest) -> Any:
    """:func:`console_user_in_share`, its place given back at once."""
    user, lease = console_user_in_share(request)
    if lease is not None:
        lease.release()
    return user


class ConsoleSessionAuthentication(authentication.SessionAuthentication):
    """DRF's session authentication (CSRF enforced as there), the session read within its
    account's share; the place is kept until the view has answered (api/db_admission.py)."""

    def authenticate(self, request):
        try:
            user, lease = console_user_in_share(request._request)
        except AccountOverShare as over:
            raise exceptions.Throttled(wait=RETRY_AFTER_S, detail=str(over)) from None
        if user is None:
            return None
        try:
            self.enforce_csrf(request)
        except BaseException:
            if lease is not None:
                lease.release()
            raise
        if lease is not None:
            keep_lease(request._request, lease)
        return user, None
