"""The place a request holds in its account's share of database connections
(api/services/db_share.py): kept on the request (:func:`keep_lease`) by DRF's throttle step
(``AccountDbShareThrottle`` in api/throttling.py: 429 ``throttled`` past the share, in the API's
error envelope) or by the key lookup, and given back by a middleware when the view has
answered, whatever it answered. A request with an API key already holds a place
from before its key was looked up (api/authentication.py); the throttle moves it to the
tenant's actual account when the one its key was remembered under differs."""

from __future__ import annotations

from asgiref.sync import iscoroutinefunction
from django.http import HttpRequest
from django.utils.decorators import sync_and_async_middleware

from api.services.db_share import DbShareLease

#: Where the admitted request's lease is kept on the HttpRequest.
LEASE_ATTR = "symphony_db_lease"
RETRY_AFTER_S = 1


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
