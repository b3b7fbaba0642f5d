"""Which addresses a tenant's ``http_fetch`` may reach, and what a host string really names.

Shared by the worker (``brokered_io``, at fetch time) and the control plane
(``api/services/tool_hosts.py``, when an owner edits the allowlist), so both read a host and
judge an address the same way; hence the standard library only (no Django, no worker state).

Two ways around a naive "is it private?" check are closed here:

* **Aliases.** ``inet_aton`` (and so ``getaddrinfo`` and every HTTP client) reads ``2130706433``,
  ``0x7f000001``, ``0177.0.0.1`` and ``127.1`` as 127.0.0.1, while ``ipaddress`` refuses them and a
  host-name check takes them for names. :func:`canonical_host` reads them as ``inet_aton`` does.
* **Wrapped IPv4.** IPv4-mapped (``::ffff:127.0.0.1``), IPv4-compatible (``::127.0.0.1``), 6to4
  (``2002:7f00:1::``), NAT64 (``64:ff9b::7f00:1``) and Teredo addresses deliver to the IPv4
  address inside them; :func:`refusal` judges that address, not the wrapper.

Only public (``is_global``) unicast addresses pass; loopback, private, CGNAT (100.64.0.0/10),
link-local (cloud metadata at 169.254.169.254), multicast, reserved and unspecified ones do not.
"""

from __future__ import annotations

import ipaddress
import re

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")
#: A label ``inet_aton`` would read as a number (decimal, ``0x`` hex or ``0`` octal).
_NUMERIC_LABEL = re.compile(r"^(0x[0-9a-f]*|[0-9]+)$")
#: One part of an address as ``inet_aton`` reads it: ``0x`` hex, ``0`` octal, or decimal.
_INET_ATON_PART = re.compile(r"^(?:0x([0-9a-f]*)|0([0-7]+)|([1-9][0-9]*|0))$")


def ipv4_alias(text: str) -> ipaddress.IPv4Address | None:
    """The IPv4 address ``inet_aton`` reads in ``text``, or None when it reads none.

    One to four dot-separated numbers, each decimal, ``0x`` hex or ``0``-prefixed octal; the
    last fills the bytes the others leave (``127.1`` is 127.0.0.1, ``2130706433`` is one number
    for all four bytes)."""
    parts = text.lower().split(".")
    if not 1 <= len(parts) <= 4:
        return None
    values = []
    for part in parts:
        match = _INET_ATON_PART.match(part)
        if match is None:
            return None
        hex_digits, octal_digits, decimal = match.groups()
        if hex_digits is not None:
            values.append(int(hex_digits or "0", 16))  # glibc reads a bare "0x" as zero
        elif octal_digits is not None:
            values.append(int(octal_digits, 8))
        else:
            values.append(int(decimal, 10))
    *leading, last = values
    if any(v > 255 for v in leading) or last >= 1 << (8 * (4 - len(leading))):
        return None
    number = 0
    for v in leading:
        number = number << 8 | v
    number <<= 8 * (4 - len(leading))
    return ipaddress.IPv4Address(number | last)


def canonical_host(host: str) -> str:
    """``host`` as one spelling per destination, or ValueError saying why it names none.

    Lower-case IDNA (``xn--``) for names, without a trailing dot; dotted-quad for any IPv4
    alias; compressed form (no brackets) for IPv6."""
    text = host.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
        if ":" not in text:
            raise ValueError(f"{host!r} is not an IPv6 address (only those are written in brackets)")
    if ":" in text:
        try:
            return ipaddress.IPv6Address(text).compressed
        except ValueError:
            raise ValueError(f"{host!r} is not a valid IPv6 address") from None
    if text.endswith(".") and len(text) > 1:
        text = text[:-1]
    try:
        text = text.lower().encode("idna").decode("ascii").lower()
    except UnicodeError:
        raise ValueError(f"{host!r} is not a valid host name") from None
    alias = ipv4_alias(text)
    if alias is not None:
        return str(alias)
    if all(_NUMERIC_LABEL.match(label) for label in text.split(".")):
        raise ValueError(f"{host!r} is neither a host name nor an IPv4 address")
    return text


def ip_literal(host: str) -> IPAddress | None:
    """The address a canonical host (see :func:`canonical_host`) is, or None for a name."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def is_localhost_name(host: str) -> bool:
    """``localhost`` and its subdomains (RFC 6761): names of this machine, never of a tool."""
    name = host.lower().rstrip(".")
    return name == "localhost" or name.endswith(".localhost")


def embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address delivers to (mapped, compatible, 6to4, NAT64, Teredo)."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]  # the client's address, where the relay delivers
    if address in _NAT64 or (address in _IPV4_COMPATIBLE and int(address) > 1):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def _kind(address: IPAddress) -> str | None:
    """What makes ``address`` (an unwrapped one) internal, or None when it is public unicast."""
    if address.is_unspecified:
        return "the unspecified address"
    if address.is_loopback:
        return "a loopback address"
    if address.is_link_local:
        return "a link-local address (where cloud metadata services listen)"
    if address.is_multicast:
        return "a multicast address"
    if isinstance(address, ipaddress.IPv4Address) and address in _CGNAT:
        return "a shared (CGNAT, 100.64.0.0/10) address"
    if address.is_private:
        return "a private address"
    if address.is_reserved:
        return "a reserved address"
    if not address.is_global:
        return "not a public address"
    return None


def refusal(address: str | IPAddress) -> str | None:
    """Why ``address`` may not be connected to on a tenant's behalf, or None when it may.

    Text such as ``"::ffff:127.0.0.1 embeds 127.0.0.1, a loopback address"``, for error
    messages. An unparsable address is refused."""
    try:
        ip = address if not isinstance(address, str) else ipaddress.ip_address(address)
    except ValueError:
        return f"{address!r} is not an IP address"
    inner = embedded_ipv4(ip) if isinstance(ip, ipaddress.IPv6Address) else None
    if inner is not None:
        kind = _kind(inner)
        return None if kind is None else f"{ip} embeds {inner}, {kind}"
    kind = _kind(ip)
    return None if kind is None else f"{ip} is {kind}"
