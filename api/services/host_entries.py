"""One tool-host entry (``host`` or ``host:port``) in the canonical spelling the tenant's list is
kept in, and why an entry cannot be listed.

Its own module, apart from ``tool_hosts`` (which reads plans), so the plan limits
(``quotas.session_limits``) can compare a run's ``limits.allowed_hosts`` the same way.
"""

from __future__ import annotations

import re

from gpu_worker import address_policy

#: A DNS name: labels of letters, digits and inner hyphens (IDNA names in their ``xn--`` form).
_HOST = re.compile(r"^(?=.{1,253}$)[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$")
_NOT_HOST = "is not host or host:port (no scheme, path or wildcard; an IPv6 address in brackets)"


class ToolHostsInvalid(ValueError):
    """An entry that is not ``host[:port]``, too many entries, or a run's hosts outside the
    tenant's list: HTTP 400 ``invalid``, the message naming them."""


def _split_port(entry: str, text: str) -> tuple[str, str]:
    """``text`` as (host, port); the port is "" when absent. IPv6 goes in brackets when it has a
    port (``[2001:db8::1]:443``); a bare one (two colons or more) is read whole as the host."""
    if text.startswith("["):
        host, bracket, rest = text.partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ToolHostsInvalid(f"{entry!r} {_NOT_HOST}")
        return host + "]", rest[1:] if rest else ""
    if text.count(":") > 1:
        return text, ""
    host, _, port = text.partition(":")
    if ":" in text and not port:
        port = "-"  # "host:" names no port
    return host, port


def normalize(entry: str) -> str:
    """``entry`` in canonical form (lower-case IDNA name, dotted IPv4, bracketed IPv6), or
    ToolHostsInvalid saying what is wrong with it.

    A literal address is judged by ``gpu_worker.address_policy`` as the worker judges what it
    connects to, aliases included (``2130706433``, ``0x7f000001``, ``127.1`` are 127.0.0.1;
    ``::ffff:127.0.0.1`` delivers to it): one that is not public is refused here, with why, rather
    than accepted and refused at every fetch. ``localhost`` names are refused alike."""
    text = str(entry).strip().lower()
    if not text or "/" in text or "*" in text:
        raise ToolHostsInvalid(f"{entry!r} {_NOT_HOST}")
    host, port = _split_port(entry, text)
    if port and not (port.isdigit() and 1 <= int(port) <= 65535):
        raise ToolHostsInvalid(f"{entry!r}: the port must be a number from 1 to 65535")
    try:
        host = address_policy.canonical_host(host)
    except ValueError as exc:
        raise ToolHostsInvalid(f"{entry!r} {_NOT_HOST}: {exc}") from None
    suffix = f":{int(port)}" if port else ""
    address = address_policy.ip_literal(host)
    if address is not None:
        why = address_policy.refusal(address)
        if why is not None:
            raise ToolHostsInvalid(f"{entry!r} is an internal address: {why}; only an operator may allow those")
        return (f"[{host}]" if address.version == 6 else host) + suffix
    if address_policy.is_localhost_name(host):
        raise ToolHostsInvalid(
            f"{entry!r} is an internal address: localhost names this machine; only an operator may allow those"
        )
    if not _HOST.match(host):
        raise ToolHostsInvalid(f"{entry!r} {_NOT_HOST}")
    return host + suffix


def spelling(entry: object) -> str:
    """The form a run's ``limits.allowed_hosts`` entry is compared in: the canonical one the
    tenant's list is stored in (``134744072`` and ``8.8.8.8`` are one host), or, for an entry
    the list could never hold, its trimmed lower-case text (which then matches nothing)."""
    try:
        return normalize(str(entry))
    except ToolHostsInvalid:
        return str(entry).strip().lower()
