"""One HTTP request through the real ASGI application (web/asgi.py), in the calling thread.

What is tested that Django's test client skips: the ASGI layers around Django (body limits,
in-flight caps, the Content-Security-Policy on refusals made in front of Django). Run in this
thread, inside the test's transaction: the request's start and end must not close the connection
that holds it, as Django's test client arranges too.

Import this module when the test module is collected: its first import of web.asgi sets Django
up again (logging included), which would drop the log capture of a test that imported it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from asgiref.sync import async_to_sync
from django.core import signals
from django.db import close_old_connections

from web.asgi import application


@dataclass(frozen=True)
class AsgiResponse:
    status: int
    #: Header names lower-cased, as bytes (what ASGI carries).
    headers: dict[bytes, bytes]
    body: bytes


def asgi_request(
    method: str, path: str, headers: list[tuple[bytes, bytes]] | None = None, body: bytes = b"", scheme: str = "http"
) -> AsgiResponse:
    """``method path`` with ``headers`` (a Host is added) and ``body``; the client stays
    connected until the whole response is sent."""
    sent: list[dict] = []
    bodies = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict:
        if bodies:
            return bodies.pop()
        await asyncio.Event().wait()  # connected until the response is sent
        raise AssertionError("unreachable")

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": scheme,
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"testserver"), *(headers or [])],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 443 if scheme == "https" else 80),
    }
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        async_to_sync(application)(scope, receive, send)
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)
    start = next(m for m in sent if m["type"] == "http.response.start")
    return AsgiResponse(
        status=start["status"],
        headers={name.lower(): value for name, value in start["headers"]},
        body=b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body"),
    )
