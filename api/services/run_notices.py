"""A Redis pub/sub notice for each run that ends, per tenant: what a ``/v1`` request queued
behind its plan's concurrent-run limit waits on (api/views/openai.py).

Why: a request that tried starting its run again every 0.25 s, each try a transaction on
PostgreSQL, would keep the web process's 16-connection pool busy with a few dozen queued (another
tenant's ``/quota`` measured 0.34 s instead of 0.03 s, spikes of 4 s). A slot frees only when a
run of the tenant ends, and every run ends through ``publish_end`` (api/services/runs.py), which
publishes here. A request tries first, without subscribing: nearly every request starts at
once, and a subscription costs it a pub/sub connection of its own (connect, handshake,
``SUBSCRIBE``, close: five round trips on the path of every answer). Only a refused request
subscribes, then tries once more before it waits, so a run that ended between its first try and
its subscription is not missed; then it tries again once per notice (one try per state change).

A notice lost (Redis restarted between the try and the wait) costs the waiter only its queueing
time: it tries once more at its deadline. Redis unreachable: it waits ``FALLBACK_POLL_S``
between tries instead (eight times fewer tries than a 0.25 s poll).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import redis.exceptions
from django.conf import settings

from api import redis_client

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Seconds between tries while the notices cannot be subscribed to.
FALLBACK_POLL_S = 2.0


def channel(tenant_id: int) -> str:
    """The channel a tenant's ended runs are announced on."""
    return f"symphony:runs-ended:{tenant_id}"


class EndedRuns:
    """Notices of a tenant's runs ending, subscribed while the ``async with`` block lasts."""

    def __init__(self, tenant_id: int) -> None:
        self.tenant_id = tenant_id
        self._pubsub: redis.asyncio.client.PubSub | None = None

    async def _subscribe(self) -> None:
        try:
            pubsub = redis_client.shared_async(settings.REDIS_URL).pubsub(ignore_subscribe_messages=True)
            await pubsub.subscribe(channel(self.tenant_id))
            self._pubsub = pubsub
        except redis.exceptions.RedisError as exc:
            log.warning("event=run_notices_unavailable tenant=%s error=%r", self.tenant_id, exc)

    async def wait(self, timeout: float) -> bool:
        """Until a run of the tenant ends (True) or ``timeout`` seconds pass (False)."""
        loop = asyncio.get_running_loop()
        until = loop.time() + timeout
        while (left := until - loop.time()) > 0:
            if self._pubsub is None:
                await asyncio.sleep(min(left, FALLBACK_POLL_S))
                return False
            try:
                message = await self._pubsub.get_message(timeout=left)
            except redis.exceptions.RedisError as exc:
                log.warning("event=run_notices_lost tenant=%s error=%r", self.tenant_id, exc)
                await self.close()
                continue
            if message is not None and message.get("type") == "message":
                return True
        return False

    async def close(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            with contextlib.suppress(redis.exceptions.RedisError):
                await pubsub.aclose()


@contextlib.asynccontextmanager
async def ended_runs(tenant_id: int) -> AsyncIterator[EndedRuns]:
    """Subscribe to the tenant's ended-run notices for the block (see the module docstring)."""
    notices = EndedRuns(tenant_id)
    await notices._subscribe()
    try:
        yield notices
    finally:
        await notices.close()


async def start_when_a_slot_frees(
    tenant_id: int, try_start: Callable[[], Awaitable[T | None]], wait_s: float
) -> T | None:
    """``try_start()`` now, and again each time a run of the tenant ends, for up to ``wait_s``
    seconds (once more at the end); what it started, or ``None`` if it never could. A try
    returns ``None`` while the tenant is at its concurrent-run limit. Subscribed only after a
    first try was refused (the module docstring says why)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    started = await try_start()
    if started is not None or wait_s <= 0:
        return started
    async with ended_runs(tenant_id) as ended:
        while True:
            started = await try_start()
            if started is not None:
                return started
            left = deadline - loop.time()
            if left <= 0:
                return None
            await ended.wait(left)
