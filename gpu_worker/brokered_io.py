"""Brokered I/O: the worker, never the sandbox, performs a LIP's network requests.

Every request is checked against the session's ``allowed_hosts`` (``host:port`` entries, or a
bare ``host`` for the scheme's default port). Loopback, private and link-local addresses are
reachable only when listed literally as an IP, so a hostname cannot be used to reach the
worker's own network. Redirects are not followed (each hop would need its own check); bodies
are capped and every call has a timeout.
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import urllib.parse
from dataclasses import dataclass

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


def _is_internal(addr: str) -> bool:
    ip = ipaddress.ip_address(addr)
    return ip.is_loopback or ip.is_private or ip.is_link_local or ip.is_unspecified or ip.is_multicast


def check_allowed(req: FetchRequest, allowed_hosts: list[str]) -> str:
    """The address to connect to, or ``EPERM`` when the host is not on the allowlist."""
    entries = {h.lower() for h in allowed_hosts}
    default_port = 443 if req.scheme == "https" else 80
    listed = f"{req.host}:{req.port}" in entries or (req.port == default_port and req.host in entries)
    if not listed:
        raise ProtocolError(
            ErrorCode.PERMISSION,
            f"host {req.host}:{req.port} is not in this run's allowed_hosts"
            " (the tenant's tool hosts, narrowed by the run's limits.allowed_hosts)",
        )
    try:
        ipaddress.ip_address(req.host)
        return req.host  # a literal IP that is listed is allowed as such, loopback included
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(req.host, req.port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise ProtocolError(ErrorCode.IO, f"cannot resolve {req.host}: {exc.strerror or exc}") from None
    addrs = [info[4][0] for info in infos]
    if not addrs or any(_is_internal(a) for a in addrs):
        raise ProtocolError(ErrorCode.PERMISSION, f"host {req.host} resolves to an internal address")
    return addrs[0]


def fetch(req: FetchRequest, address: str, max_bytes: int) -> HttpReply:
    """Perform the request (blocking; run it in a thread). Body capped at ``max_bytes``."""
    conn_cls = http.client.HTTPSConnection if req.scheme == "https" else http.client.HTTPConnection
    conn = conn_cls(address if req.scheme == "http" else req.host, req.port, timeout=req.timeout)
    try:
        headers = {"Host": req.host if req.port in (80, 443) else f"{req.host}:{req.port}", **req.headers}
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
        conn.close()
