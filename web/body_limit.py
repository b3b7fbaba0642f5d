"""The size limit of every request body, enforced in front of Django (``web/asgi.py``).

Django's ASGI handler reads the whole body (into memory, then a temporary file) before any view
or upload handler runs, and neither uvicorn nor the ALB limits it: left to them, a 1 GB upload
is taken in whole and only refused afterwards, when the view reads it. Here a body is refused with
413 by its declared ``Content-Length`` before a byte of it is read, and a chunked body (no
declared length) as soon as what arrived passes the limit; Django never sees either. The
answer is the documented error envelope (the OpenAI one under ``/v1/``) with
``Connection: close``, so the server stops taking the rest of the body.

Smaller limits apply inside Django: a program file's (``SYMPHONY_MAX_PROGRAM_BYTES``,
api/uploads.py) and JSON bodies' (api/parsers.py), for servers that do not run this wrapper.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

SETTING = "SYMPHONY_MAX_REQUEST_BYTES"


def error_envelope(
    path: str, code: str, message: str, openai_type: str = "invalid_request_error", detail: Any = None
) -> dict:
    """An error answered in front of Django: the OpenAI envelope under ``/v1/``, the API's
    documented ``{"error": {code, message, detail}}`` everywhere else."""
    if path.startswith("/v1/"):
        return {"error": {"message": message, "type": openai_type, "param": None, "code": code}}
    return {"error": {"code": code, "message": message, "detail": detail}}


async def send_json(send: Send, status: int, payload: dict, headers: list[tuple[bytes, bytes]]) -> None:
    """A whole JSON response from ASGI middleware, with ``headers`` after the content ones."""
    body = json.dumps(payload).encode()
    start = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers]
    await send({"type": "http.response.start", "status": status, "headers": start})
    await send({"type": "http.response.body", "body": body})


def too_large_body(path: str, limit: int) -> dict:
    """The 413's body."""
    message = f"request body is over the limit of {limit} bytes ({SETTING})"
    return error_envelope(path, "too_large", message, detail={"limit": limit})


def _declared_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # malformed: the server or Django answers it
    return None


class BodyLimit:
    """ASGI middleware: 413 for an HTTP request whose body is over ``limit`` bytes."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _declared_length(scope)
        if declared is not None and declared > self.limit:
            await self._refuse(scope, send)
            return
        received = 0
        over = False
        started = False

        async def counted_receive() -> Message:
            nonlocal received, over
            if over:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    # Django's body reader stops at a disconnect and answers nothing.
                    over = True
                    return {"type": "http.disconnect"}
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        await self.app(scope, counted_receive, tracked_send)
        if over and not started:
            await self._refuse(scope, send)

    async def _refuse(self, scope: Scope, send: Send) -> None:
        body = too_large_body(scope.get("path", ""), self.limit)
        await send_json(send, 413, body, [(b"connection", b"close")])
