"""Bounds on requests in flight in one web process, enforced in front of Django (``web/asgi.py``).

uvicorn accepts every connection and hands every request to the application, and nothing in
front of it on a single host bounds them: one client holding a few thousand requests open (event
streams, or a POST whose body it sends one byte a minute) held as many file descriptors and
coroutines, and every other client's requests then waited behind them. Here:

* a client (the address :func:`api.client_address.client_address` resolves, so a trusted load
  balancer's clients are told apart) may have ``per_client`` requests in flight; past that it
  gets 429 ``too_many_requests_in_flight`` with ``Retry-After``;
* the process takes at most ``total`` in flight (by default three quarters of its file
  descriptor limit); past that every client gets 503 ``overloaded`` with ``Retry-After``;
* a request body whose next chunk does not arrive within ``body_idle_timeout_s`` is cut off
  with 408 ``body_timeout``, so a trickled body cannot hold a slot for ever.

Health checks (``/api/v1/health``) are never refused here: a busy process is alive, and a load
balancer that saw it fail would replace it and drop every stream it serves.
"""

from __future__ import annotations

import asyncio
import resource
from collections import Counter
from collections.abc import Callable

from web.body_limit import ASGIApp, Message, Receive, Scope, Send, error_envelope, send_json

EXEMPT_PATHS = frozenset({"/api/v1/health"})

#: (status, code, OpenAI error type) of each refusal.
_REFUSALS = {
    "client": (429, "too_many_requests_in_flight", "rate_limit_error"),
    "total": (503, "overloaded", "server_error"),
    "body": (408, "body_timeout", "invalid_request_error"),
}


def default_total_limit() -> int:
    """Three quarters of the process's file descriptor limit: each request in flight holds a
    socket, and the rest are left for PostgreSQL, Redis and files."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 8192
    return max(64, soft * 3 // 4)


class InflightLimit:
    """ASGI middleware: per-client and per-process bounds on HTTP requests in flight, and an
    idle timeout on request bodies. ``client_of`` maps a scope to the client's address."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        per_client: int,
        total: int,
        body_idle_timeout_s: float,
        client_of: Callable[[Scope], str],
    ) -> None:
        self.app = app
        self.per_client = per_client
        self.total = total
        self.body_idle_timeout_s = body_idle_timeout_s
        self.client_of = client_of
        self.in_flight: Counter[str] = Counter()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in EXEMPT_PATHS:
            await self.app(scope, receive, send)
            return
        client = self.client_of(scope)
        if sum(self.in_flight.values()) >= self.total:
            message = f"this server has {self.total} requests in flight, its limit; retry shortly"
            await self._refuse(scope, send, "total", message)
            return
        if self.in_flight[client] >= self.per_client:
            message = (
                f"this client has {self.per_client} requests in flight, the limit per client "
                "(SYMPHONY_MAX_INFLIGHT_PER_CLIENT); finish or close some first"
            )
            await self._refuse(scope, send, "client", message)
            return
        self.in_flight[client] += 1
        try:
            await self._serve(scope, receive, send)
        finally:
            self.in_flight[client] -= 1
            if self.in_flight[client] <= 0:
                del self.in_flight[client]

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        body_done = False
        timed_out = False
        started = False

        async def timed_receive() -> Message:
            nonlocal body_done, timed_out
            if timed_out:
                return {"type": "http.disconnect"}
            if body_done:  # an event stream waiting for the client to leave: no timeout
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), self.body_idle_timeout_s)
            except TimeoutError:
                timed_out = True  # Django's body reader stops at a disconnect and answers nothing
                return {"type": "http.disconnect"}
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_done = True
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        await self.app(scope, timed_receive, tracked_send)
        if timed_out and not started:
            message = f"no part of the request body arrived for {self.body_idle_timeout_s:g} s"
            await self._refuse(scope, send, "body", message)

    async def _refuse(self, scope: Scope, send: Send, kind: str, message: str) -> None:
        status, code, openai_type = _REFUSALS[kind]
        body = error_envelope(scope.get("path", ""), code, message, openai_type)
        # A timed-out body is abandoned with its connection; the others may retry in a second.
        extra = [(b"connection", b"close")] if kind == "body" else [(b"retry-after", b"1")]
        await send_json(send, status, body, extra)
