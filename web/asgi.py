"""ASGI entry point (served by uvicorn so many SSE clients can stream at once), behind the
request body limit (web/body_limit.py) and the bounds on requests in flight
(web/inflight_limit.py), which neither uvicorn nor the load balancer has.

Persistent database connections are off here unless ``DATABASE_CONN_MAX_AGE`` says otherwise:
under ASGI each request runs its synchronous code on a thread of its own (asgiref's
``ThreadSensitiveContext``), so a connection kept for the next request is never reused by it.
It only lingers in the finished thread until the garbage collector finds it, and a few hundred
requests left the web process holding every connection PostgreSQL allows after their clients
had gone. With 0, Django closes each request's connection when the request finishes.
"""

import os

from django.conf import settings
from django.core.asgi import get_asgi_application

from api.client_address import client_address, parse_networks
from web.body_limit import BodyLimit
from web.inflight_limit import InflightLimit

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "web.settings")
os.environ.setdefault("DATABASE_CONN_MAX_AGE", "0")

_proxies = parse_networks(settings.SYMPHONY_TRUSTED_PROXIES)


def _client_of(scope) -> str:
    """The client's address as the API's per-address guards see it (api/client_address.py)."""
    peer = (scope.get("client") or ("", 0))[0]
    forwarded = next((v.decode("latin-1") for k, v in scope.get("headers", []) if k == b"x-forwarded-for"), None)
    return client_address(peer, forwarded, _proxies)


application = InflightLimit(
    BodyLimit(get_asgi_application(), settings.SYMPHONY_MAX_REQUEST_BYTES),
    per_client=settings.SYMPHONY_MAX_INFLIGHT_PER_CLIENT,
    total=settings.SYMPHONY_MAX_INFLIGHT_TOTAL,
    body_idle_timeout_s=settings.SYMPHONY_BODY_IDLE_TIMEOUT_S,
    client_of=_client_of,
)
