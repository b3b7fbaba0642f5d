"""ASGI entry point (served by uvicorn so many SSE clients can stream at once), behind the
request body limit (web/body_limit.py) and the bounds on requests in flight
(web/inflight_limit.py), which neither uvicorn nor the load balancer has.

Database connections come from a bounded pool here (``DATABASE_POOL_MAX_SIZE``, default 16; web/settings.py):
under ASGI each request runs its synchronous code on a thread of its own (asgiref's
``ThreadSensitiveContext``), so a connection kept in that thread for the next request is never
reused by it. Kept that way (``CONN_MAX_AGE`` > 0), it lingered in the finished thread until the
garbage collector found it, and a few hundred requests left the web process holding every
connection PostgreSQL allows after their clients had gone; closed at each request's end
(``CONN_MAX_AGE`` 0), every request paid for opening one. With the pool, Django's close hands the
connection back, the next request's thread takes it, and the process never holds more than the
bound. ``DATABASE_POOL_MAX_SIZE=0`` goes back to a connection per request.
"""

import os

from django.conf import settings
from django.core.asgi import get_asgi_application

from api.client_address import client_address, parse_networks
from web.body_limit import BodyLimit
from web.csp import ContentSecurityPolicyASGI
from web.inflight_limit import InflightLimit

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "web.settings")
os.environ.setdefault("DATABASE_CONN_MAX_AGE", "0")
os.environ.setdefault("DATABASE_POOL_MAX_SIZE", "16")

_proxies = parse_networks(settings.SYMPHONY_TRUSTED_PROXIES)


def _client_of(scope) -> str:
    """The client's address as the API's per-address guards see it (api/client_address.py)."""
    peer = (scope.get("client") or ("", 0))[0]
    forwarded = next((v.decode("latin-1") for k, v in scope.get("headers", []) if k == b"x-forwarded-for"), None)
    return client_address(peer, forwarded, _proxies)


# Outermost: the refusals of the layers in front of Django carry the policy too (web/csp.py).
application = ContentSecurityPolicyASGI(
    InflightLimit(
        BodyLimit(get_asgi_application(), settings.SYMPHONY_MAX_REQUEST_BYTES),
        per_client=settings.SYMPHONY_MAX_INFLIGHT_PER_CLIENT,
        total=settings.SYMPHONY_MAX_INFLIGHT_TOTAL,
        body_idle_timeout_s=settings.SYMPHONY_BODY_IDLE_TIMEOUT_S,
        client_of=_client_of,
    )
)
