"""Where the per-account share of database connections (api/services/db_share.py) is enforced:
DRF's throttle step admits an authenticated request against its account's share (429
``throttled`` past it, in the API's error envelope), and a middleware gives the place back when
the view has answered, whatever it answered. A request with an API key already holds a place
from before its key was looked up (api/authentication.py); the throttle moves it to the
tenant's actual account when the one its key was remembered under differs."""

from __future__ import annotations

from asgiref.sync import iscoroutinefunction
from django.http import HttpRequest
from django.utils.decorators import sync_and_async_middleware
from rest_framework import exceptions
from rest_framework.throttling import BaseThrottle

from api.services.db_share import AccountOverShare, DbShareLease, web_share

#: Where the admitted request's lease is kept on the HttpRequest.
LEASE_ATTR = "symphony_db_lease"
RETRY_AFTER_S = 1


class AccountDbShareThrottle(BaseThrottle):
    """DEFAULT_THROTTLE_CLASSES: one place in the request's account's share of the process's
    database connections. Requests without a tenant (anonymous, or a user in none) are left to
    the views' own checks."""

    def allow_request(self, request, view) -> bool:
        from api.tenancy import active_tenant  # here: api.tenancy imports DRF's views

        share = web_share()
        if share is None or not (request.user and request.user.is_authenticated):
            return True
        held: DbShareLease | None = getattr(request._request, LEASE_ATTR, None)
        try:
            tenant = active_tenant(request)
        except exceptions.PermissionDenied:
            return True
        if held is not None and not held.released and held.account == tenant.account_key:
            return True  # admitted with its key's lookup, or a view that runs the throttles twice
        try:
            lease = share.acquire(tenant.account_key)
        except AccountOverShare as over:
            raise exceptions.Throttled(wait=RETRY_AFTER_S, detail=str(over)) from None
        # Replaces a place the key's lookup held in another share (unidentified, or stale).
        keep_lease(request._request, lease)
        return True


def keep_lease(request: HttpRequest, lease: DbShareLease) -> None:
    """Keep ``lease`` on ``request`` until the view has answered (:func:`release_db_share`)."""
    held: DbShareLease | None = getattr(request, LEASE_ATTR, None)
    if held is not None and held is not lease:
        held.release()
    setattr(request, LEASE_ATTR, lease)


def _release(request: HttpRequest) -> None:
    lease = getattr(request, LEASE_ATTR, None)
    if lease is not None:
        lease.release()


@sync_and_async_middleware
def release_db_share(get_response):
    """Give the request's place in its account's share back once the view has answered."""

    async def async_middleware(request: HttpRequest):
        try:
            return await get_response(request)
        finally:
            _release(request)

    def sync_middleware(request: HttpRequest):
        try:
            return get_response(request)
        finally:
            _release(request)

    return async_middleware if iscoroutinefunction(get_response) else sync_middleware
