"""Per-account cap on concurrent event streams (``/api/v1/runs/<id>/events`` and the ``/v1``
requests that wait on a run), counted in Redis so every web process enforces the same cap. The
streams of every tenant one person created count together (``Tenant.account_key``): a cap per
tenant multiplied by the tenants a person can create.

Why: a stream is held open for as long as its run lasts (or forever, by a client that never
reads); without a cap one tenant's few hundred streams take the web processes' Redis and event
loop time from every other tenant, well under its request rate.

Each open stream holds a *lease*: a member of the sorted set ``symphony:streams:<account>``
scored with its expiry (Redis server time). A lease is refreshed while its stream is open and
removed when it ends, whatever the way (the client left, the run ended); a lease whose web
process died with it simply expires ``LEASE_TTL_S`` later, so a vanished client or a killed
process never keeps a slot for good. Counting and admitting is one Lua script, so concurrent
requests of one account cannot both take the last slot.

Redis unreachable: the stream is let through uncounted (it cannot stream without Redis anyway,
and an outage of the counter must not refuse what would work; api/throttling.py does the same).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass

import redis.asyncio as aioredis
import redis.exceptions
from django.conf import settings

from api import redis_client

log = logging.getLogger(__name__)

#: A lease not refreshed for this long is gone (its stream's process died or hung).
LEASE_TTL_S = 30
#: An open stream's lease is refreshed this often (well inside the TTL).
REFRESH_EVERY_S = 10
#: What a refused client is told to wait: streams end when their clients leave, so a slot can
#: free at any moment; this is a polite interval, not a promise.
RETRY_AFTER_S = 5

#: KEYS[1] the account's set; ARGV: cap, TTL (s), lease id. Returns 1 (admitted) or 0 (full).
#: A lease already in the set is admitted again: a call repeated after its reply was lost (the
#: client retries on a dropped connection) must not count its own lease against the cap.
_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZSCORE', KEYS[1], ARGV[3]) then
  return 1
end
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then
  return 0
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[3])
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2]))
return 1
"""
#: KEYS[1] the account's set; ARGV: TTL (s), lease id. Pushes the lease's expiry (only if it is
#: still there: one that expired meanwhile is not revived past the cap).
_REFRESH = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
if redis.call('ZADD', KEYS[1], 'XX', 'CH', now + tonumber(ARGV[1]), ARGV[2]) == 1 then
  redis.call('EXPIRE', KEYS[1], tonumber(ARGV[1]))
end
return 1
"""


class StreamLimitReached(Exception):
    """The account has as many streams open as it may; the message names the cap."""

    def __init__(self, cap: int) -> None:
        super().__init__(
            f"this tenant's account may hold {cap} concurrent event streams across its tenants and has them"
            f" all open; close one or retry in {RETRY_AFTER_S} s"
        )
        self.cap = cap
        self.retry_after = RETRY_AFTER_S


def _key(account: str) -> str:
    return f"symphony:streams:{account}"


def _redis() -> aioredis.Redis:
    """The loop's pooled client: a lease operation borrows a connection for its one command, and
    a lease holds none in between (one whose stream never starts is then left to expire with
    nothing open)."""
    return redis_client.shared_async(settings.REDIS_URL)


@dataclass
class Lease:
    """One admitted stream's slot: :meth:`keep_alive` once its stream starts, :meth:`release`
    when it ends.

    Refreshed by a task of its own rather than as events flow: a client that stops reading
    blocks its stream's writes, and a lease refreshed only between writes would expire while
    the stream stays open, letting the account open more than its cap. Started with the stream,
    not at admission: a response whose stream never starts (its client left in between) is
    never closed by Django, and its lease must then expire by itself."""

    #: ``Tenant.account_key`` of the stream's tenant: whose slot it is.
    account: str
    lease_id: str
    counted: bool = True
    released: bool = False
    refresher: asyncio.Task | None = None

    def keep_alive(self) -> None:
        """Refresh the lease every ``REFRESH_EVERY_S`` until :meth:`release`."""
        if self.counted and self.refresher is None and not self.released:
            self.refresher = asyncio.create_task(self._refresh_forever())

    async def _refresh_forever(self) -> None:
        while not self.released:
            await asyncio.sleep(REFRESH_EVERY_S)
            try:
                await _redis().eval(_REFRESH, 1, _key(self.account), LEASE_TTL_S, self.lease_id)
            except redis.exceptions.RedisError as exc:
                log.warning("event=stream_lease_not_refreshed account=%s error=%r", self.account, exc)

    async def release(self) -> None:
        """Give the slot back; idempotent."""
        if self.released:
            return
        self.released = True
        if self.refresher is not None:
            self.refresher.cancel()
        if not self.counted:
            return
        try:
            await _redis().zrem(_key(self.account), self.lease_id)
        except redis.exceptions.RedisError as exc:  # it expires by itself
            log.warning("event=stream_lease_not_released account=%s error=%r", self.account, exc)


async def acquire(account: str, cap: int) -> Lease:
    """A lease for one more stream of the account (``Tenant.account_key``);
    :class:`StreamLimitReached` at ``cap``."""
    lease_id = uuid.uuid4().hex
    try:
        admitted = await _redis().eval(_ACQUIRE, 1, _key(account), cap, LEASE_TTL_S, lease_id)
    except redis.exceptions.RedisError as exc:
        log.warning("event=stream_lease_unchecked account=%s error=%r", account, exc)
        return Lease(account, lease_id, counted=False)
    if not admitted:
        log.info("event=stream_limit_reached account=%s cap=%d", account, cap)
        raise StreamLimitReached(cap)
    return Lease(account, lease_id)
