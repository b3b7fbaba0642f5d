"""Brokered I/O: the worker, never the sandbox, performs a LIP's network requests.

Every request is checked against the session's ``allowed_hosts`` (``host:port`` entries, or a
bare ``host`` for the scheme's default port), the URL's host read in its canonical spelling
(``address_policy.canonical_host``: ``127.1`` is 127.0.0.1). A listed name is resolved once, every
address it resolves to must be public (``address_policy.refusal``: not loopback, private, CGNAT,
link-local, multicast, reserved, nor an IPv6 form wrapping one), and the connection goes to an
address so checked: https opens TCP to that address and wraps TLS with the name as SNI and for
certificate verification, so a DNS answer that changes after the check (rebinding) is never used.
Internal addresses are reachable only when an operator lists one literally as an IP (a tenant's
owners cannot: ``api/services/tool_hosts.py``). Redirects are not followed (a 3xx is returned to
the program as is), bodies are capped and every call has a timeout.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import urllib.parse
from dataclasses import dataclass

from gpu_worker import address_policy
from gpu_worker.protocol import ErrorCode, HttpFetch, HttpReply, ProtocolError

METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"})
MAX_HEADERS = 64
MAX_REQUEST_BODY = 1024 * 1024


@dataclass(frozen=True)
class FetchRequest:
    scheme: str
    host: str
    port: int
    path: str
    method: str
    headers: dict[str, str]
    body: bytes | None
    timeout: float


def _bad(message: str) -> ProtocolError:
    return ProtocolError(ErrorCode.BAD_ARGS, message)


def parse_request(args: HttpFetch, timeout_cap: float) -> FetchRequest:
    """What the decoded ``http_fetch`` asks for, once URL, headers and body make sense."""
    url = args.url
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise _bad("url must be http(s)://host[:port]/...")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise _bad("bad port in url") from None
    method = args.method.upper()
    if method not in METHODS:
        raise _bad(f"method must be one of {sorted(METHODS)}")
    headers = args.headers or {}
    if not isinstance(headers, dict) or len(headers) > MAX_HEADERS:
        raise _bad("headers must be a small map of strings")
    for k, v in headers.items():
        if not isinstance(k, str) or not isinstance(v, str) or "\n" in k + v or "\r" in k + v:
            raise _bad("header names and values must be single-line strings")
    body = args.body
    if isinstance(body, str):
        body = body.encode()
    if body is not None and (not isinstance(body, bytes) or len(body) > MAX_REQUEST_BODY):
        raise _bad(f"body must be bytes or str of at most {MAX_REQUEST_BODY} bytes")
    timeout = timeout_cap if args.timeout is None else args.timeout
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return FetchRequest(
        parts.scheme, parts.hostname.lower(), port, path, method, dict(headers), body, min(float(timeout), timeout_cap)
    )


@dataclass(frozen=True)
class Destination:
    """Where a checked request goes: ``host`` (canonical; the Host header, SNI and the name the
    certificate must carry) and the ``(family, sockaddr)`` pairs checked for it, in the
    resolver's order. Nothing resolves ``host`` again."""

    host: str
    targets: tuple[tuple[int, tuple], ...]


def _host_key(host: str) -> str:
    """``host`` as allowlist entries write it: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host else host


def _listed(keys: tuple[str, ...], port: int, default_port: int, entries: set[str]) -> str | None:
    """The first of ``keys`` that ``entries`` list for ``port``, or None."""
    for key in keys:
        if f"{key}:{port}" in entries or (port == default_port and key in entries):
            return key
    return None


def _resolve(host: str, port: int, numeric: bool) -> tuple[tuple[int, tuple], ...]:
    """``host``'s addresses as ``(family, sockaddr)``, from one lookup (no DNS when ``numeric``)."""
    flags = socket.AI_NUMERICHOST if numeric else 0
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=flags)
    except OSError as exc:
        raise ProtocolError(ErrorCode.IO, f"cannot resolve {host}: {exc.strerror or exc}") from None
    return tuple(dict.fromkeys((family, sockaddr) for family, _, _, _, sockaddr in infos))


def check_allowed(req: FetchRequest, allowed_hosts: list[str]) -> Destination:
    """Where to connect, or ``EPERM`` when the host is not listed or reaches an internal address."""
    try:
        host = address_policy.canonical_host(req.host)
    except ValueError as exc:
        raise _bad(f"url host: {exc}") from None
    entries = {h.strip().lower() for h in allowed_hosts}
    default_port = 443 if req.scheme == "https" else 80
    key = _listed((_host_key(host), _host_key(req.host)), req.port, default_port, entries)
    if key is None:
        raise ProtocolError(
            ErrorCode.PERMISSION,
            f"host {req.host}:{req.port} is not in this run's allowed_hosts"
            " (the tenant's tool hosts, narrowed by the run's limits.allowed_hosts)",
        )
    literal = address_policy.ip_literal(host)
    if literal is not None and key == _host_key(host):
        # An address listed as itself: only an operator can list an internal one (the API
        # refuses them), so it is reached as listed, loopback included.
        return Destination(host, _resolve(host, req.port, numeric=True))
    if address_policy.is_localhost_name(host):
        raise ProtocolError(
            ErrorCode.PERMISSION,
            f"host {req.host} is an internal address: localhost names this machine; {_PUBLIC_ONLY}",
        )
    targets = _resolve(host, req.port, numeric=literal is not None)
    if not targets:
        raise ProtocolError(ErrorCode.IO, f"cannot resolve {req.host}: no addresses")
    for _, sockaddr in targets:
        why = address_policy.refusal(sockaddr[0])
        if why is not None:
            raise ProtocolError(
                ErrorCode.PERMISSION, f"host {req.host} resolves to an internal address: {why}; {_PUBLIC_ONLY}"
            )
    return Destination(host, targets)


_PUBLIC_ONLY = "http_fetch reaches only public addresses"


def _connect(dest: Destination, timeout: float) -> socket.socket:
    """A TCP connection to the first of ``dest.targets`` that accepts (a timeout ends the try)."""
    failure: OSError | None = None
    for family, sockaddr in dest.targets:
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(sockaddr)
            return sock
        except TimeoutError:
            sock.close()
            raise
        except OSError as exc:
            sock.close()
            failure = exc
    assert failure is not None
    raise failure


class _CheckedConnection(http.client.HTTPConnection):
    """An HTTPConnection over a socket already open to a checked address. It never opens one of
    its own: ``http.client`` would resolve the name again, and the answer may differ."""

    def __init__(self, sock: socket.socket, host: str, port: int, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self.sock = sock

    def connect(self) -> None:
        raise http.client.NotConnected("the checked connection is closed; http_fetch does not reconnect")


def fetch(req: FetchRequest, dest: Destination, max_bytes: int) -> HttpReply:
    """Perform the request (blocking; run it in a thread). Body capped at ``max_bytes``."""
    conn: _CheckedConnection | None = None
    try:
        sock = _connect(dest, req.timeout)
        if req.scheme == "https":
            try:
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=dest.host)
            except BaseException:
                sock.close()
                raise
        conn = _CheckedConnection(sock, dest.host, req.port, req.timeout)
        default_port = 443 if req.scheme == "https" else 80
        host = _host_key(dest.host)
        headers = {"Host": host if req.port == default_port else f"{host}:{req.port}", **req.headers}
        conn.request(req.method, req.path, body=req.body, headers=headers)
        resp = conn.getresponse()
        body = resp.read(max_bytes + 1)
        if len(body) > max_bytes:
            raise ProtocolError(ErrorCode.IO, f"response body exceeds {max_bytes} bytes")
        return HttpReply(status=resp.status, headers=dict(resp.getheaders()[:MAX_HEADERS]), body=body)
    except ProtocolError:
        raise
    except TimeoutError:
        raise ProtocolError(ErrorCode.TIMEOUT, f"http_fetch timed out after {req.timeout:.1f}s") from None
    except (OSError, http.client.HTTPException) as exc:
        raise ProtocolError(ErrorCode.IO, f"http_fetch failed: {type(exc).__name__}: {exc}") from None
    finally:
        if conn is not None:
            conn.close()
