"""The client's address, the one key of every per-address guard (login, sign-up and reset
throttles, the wrong-API-key guard, the loopback-only ``/metrics``).

``X-Forwarded-For`` is written by whoever sends the request, so it is believed only as far as
the proxies the operator named in ``SYMPHONY_TRUSTED_PROXIES`` (the load balancer's subnets):
starting from the TCP peer, each hop that is a trusted proxy hands over to the address it
appended, and the first untrusted one is the client. With no trusted proxies (the default) the
peer is the client and the header is ignored; otherwise a new forged value per request would be
a new client per request, and a forged victim's address would lock the victim out.

:func:`client_address_middleware` writes the result to ``REMOTE_ADDR`` before anything reads it,
and DRF's ``NUM_PROXIES`` is 0 so its throttles key on that and never parse the header again.
The web server must not rewrite the peer itself (uvicorn runs with ``--no-proxy-headers``).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from asgiref.sync import iscoroutinefunction
from django.conf import settings
from django.http import HttpRequest
from django.utils.decorators import sync_and_async_middleware

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(items: Iterable[str]) -> tuple[Network, ...]:
    """``["10.0.0.0/20", "127.0.0.1"]`` -> networks; a value that is not an address or a CIDR
    raises ``ValueError`` (a typo must not silently trust nothing, or everything)."""
    return tuple(ipaddress.ip_network(item.strip(), strict=False) for item in items if item.strip())


def _ip(value: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """An address as a proxy writes it: bare, ``1.2.3.4:port`` or ``[v6]:port``; else None."""
    value = value.strip()
    if value.startswith("[") and "]" in value:
        value = value[1 : value.index("]")]
    elif value.count(":") == 1:
        value = value.split(":", 1)[0]
    try:
        return ipaddress.ip_address(value)
    except ValueError:
        return None


def _trusted(address: ipaddress.IPv4Address | ipaddress.IPv6Address | None, proxies: tuple[Network, ...]) -> bool:
    return address is not None and any(address in network for network in proxies)


def client_address(peer: str, forwarded_for: str | None, proxies: tuple[Network, ...]) -> str:
    """The right-most address of ``peer`` + ``X-Forwarded-For`` that is not a trusted proxy.

    Walking from the peer leftwards, a hop is believed only while the one that wrote it is
    trusted. An entry that is not an address ends the walk at the proxy that passed it on; a
    chain of trusted proxies only yields its left-most entry."""
    current = _ip(peer)
    if not forwarded_for or not _trusted(current, proxies):
        return peer
    for entry in reversed(forwarded_for.split(",")):
        hop = _ip(entry)
        if hop is None:
            return str(current)
        current = hop
        if not _trusted(current, proxies):
            break
    return str(current)


@sync_and_async_middleware
def client_address_middleware(get_response):
    """Set ``REMOTE_ADDR`` to :func:`client_address` (``SYMPHONY_TRUSTED_PROXIES``)."""
    proxies = parse_networks(settings.SYMPHONY_TRUSTED_PROXIES)

    def resolve(request: HttpRequest) -> None:
        peer = request.META.get("REMOTE_ADDR", "")
        request.META["REMOTE_ADDR"] = client_address(peer, request.META.get("HTTP_X_FORWARDED_FOR"), proxies)

    if iscoroutinefunction(get_response):

        async def middleware(request: HttpRequest):
            resolve(request)
            return await get_response(request)

    else:

        def middleware(request: HttpRequest):
            resolve(request)
            return get_response(request)

    return middleware
