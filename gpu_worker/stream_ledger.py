"""Redis memory held by retained run event streams, counted per *account* (a person's tenants).

Why: each run may stream its plan's ``stream_bytes_per_run`` into ``run:<id>``, kept for the
retention period after it ends; a few dozen runs of one tenant filled Redis's ``maxmemory``,
and Redis (``noeviction``) then refused the Celery broker, the stream leases and the rate
counters of every tenant. So the bytes of all retained streams are one pool,
``PoolName.REDIS_BYTES`` (gpu_worker/resource_model.py), whose capacity is Redis's
``maxmemory`` measured when the worker connects (``INFO memory``; ``fallback_bytes`` when Redis
runs unbounded) less ``headroom_bytes`` for the broker, leases, counters and the closing
``status``/``end`` events the control plane writes (those are never refused).

Each account may hold ``pool.fair_share(1, n)`` of it, ``n`` being the accounts that hold
bytes in retained streams now (itself included): alone, the pool's ceiling (the reserve stays
for the others); with others, an equal share. Bytes are counted where they are added: one Lua
script XADDs a batch of events and counts each against its stream's account, refusing (not
storing) an event a LIP sent that would take its account past its share or the pool past its
capacity. Events the worker itself writes (``kv`` snapshots) are counted, never refused.

The ledger (keys under ``symphony:stream-bytes:``): per stream its bytes and its account, a
sorted set of streams by when to look at them next, per account its total, and the total of
all. Entries are credited back when their stream is gone (expired or deleted): each script call
first looks at up to ``SWEEP_MAX`` streams that are due, crediting those that no longer exist
and rescheduling the others at their remaining TTL, so it is correct under expiry without
keyspace notifications. Entries trimmed by ``MAXLEN`` are not credited until the stream goes
(the ledger over-counts, never under-counts).

Stdlib and redis only: ``gpu_worker`` never imports Django.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpu_worker.resource_model import Pool, PoolName

MIB = 1024 * 1024
PREFIX = "symphony:stream-bytes:"
#: The ledger's keys, in the script's KEYS order.
KEYS = (PREFIX + "due", PREFIX + "streams", PREFIX + "owners", PREFIX + "accounts", PREFIX + "total")
#: Streams looked at per script call for expiry (bounds the script's time).
SWEEP_MAX = 32
#: What Redis itself takes per entry beyond its ``type`` and ``data`` bytes, measured on
#: Redis 7: ~20 bytes an entry of a few bytes, ~15% of a 100 KB one (the allocator's size
#: classes). Counted generously: the pool is Redis's memory, not the payload.
ENTRY_OVERHEAD_BYTES = 32


def stored_cost(entry_bytes: int) -> int:
    """Bytes of Redis memory one stream entry of ``entry_bytes`` is counted as."""
    return entry_bytes + entry_bytes // 4 + ENTRY_OVERHEAD_BYTES


@dataclass(frozen=True)
class StreamBudget:
    """How the pool is sized and how long streams live (worker flags ``--redis-*``)."""

    #: Redis memory kept out of the pool for the broker, leases, counters and closing events.
    headroom_bytes: int = 64 * MIB
    #: The memory assumed when Redis reports ``maxmemory`` 0 (unbounded): the 512 MiB that
    #: ``make up`` configures, so a forgotten setting still leaves a bound.
    fallback_bytes: int = 512 * MIB
    #: A stream's TTL while its run writes to it, refreshed on every write (the control plane
    #: sets the retention when the run ends: ``SYMPHONY_RUN_EVENTS_RETENTION_S``).
    running_ttl_s: int = 24 * 3600

    def pool(self, maxmemory: int) -> Pool:
        """The pool for a Redis of ``maxmemory`` bytes (0: unbounded). The headroom is at
        most half of the memory, so a small Redis still has a pool."""
        total = maxmemory if maxmemory > 0 else self.fallback_bytes
        return Pool(PoolName.REDIS_BYTES, total - min(self.headroom_bytes, total // 2))


@dataclass(frozen=True)
class Refusal:
    """Why an event was not stored: its account's holding, its share and the pool."""

    held: int
    cost: int
    limit: int
    accounts: int
    free: int
    pool: Pool

    def message(self) -> str:
        if self.held + self.cost <= self.limit:
            return (
                f"Redis bound on retained event streams reached: the {self.pool.capacity} bytes of Redis for"
                f" streams hold {self.pool.capacity - self.free} and this event takes {self.cost}; this"
                f" account holds {self.held} of its share of {self.limit} (the account-wide bound); streams are"
                " freed when they expire after the run ends. Per run the plan's stream_bytes_per_run applies too."
            )
        return (
            f"Redis bound on retained event streams reached: this account's runs hold {self.held} bytes of"
            f" event streams and {self.cost} more would pass its share of {self.limit} bytes (the"
            f" account-wide bound: an equal share of the {self.pool.capacity} bytes of Redis for streams among"
            f" the {self.accounts} accounts holding some, at most {self.pool.ceiling}); streams are freed"
            " when they expire after the run ends. Per run the plan's stream_bytes_per_run applies too."
        )


#: KEYS: see :data:`KEYS`. ARGV: capacity, ceiling, running TTL (ms), MAXLEN, SWEEP_MAX, then
#: per event six values: stream key, account, enforce (1/0), cost, type, data. Returns per
#: event four integers: stored (1/0), the account's bytes after it, its limit, accounts holding.
REPLY_FIELDS = 5
APPEND = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local capacity, ceiling = tonumber(ARGV[1]), tonumber(ARGV[2])
local ttl, maxlen = tonumber(ARGV[3]), tonumber(ARGV[4])
for _, key in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[5]))) do
  local left = redis.call('PTTL', key)
  if left == -2 then
    local bytes = tonumber(redis.call('HGET', KEYS[2], key) or '0')
    local owner = redis.call('HGET', KEYS[3], key)
    if owner and redis.call('HINCRBY', KEYS[4], owner, -bytes) <= 0 then
      redis.call('HDEL', KEYS[4], owner)
    end
    redis.call('DECRBY', KEYS[5], bytes)
    redis.call('HDEL', KEYS[2], key)
    redis.call('HDEL', KEYS[3], key)
    redis.call('ZREM', KEYS[1], key)
  else
    if left < 0 then left = ttl end
    redis.call('ZADD', KEYS[1], now + left, key)
  end
end
local out = {}
for i = 6, #ARGV, 6 do
  local key, account, enforce, cost = ARGV[i], ARGV[i + 1], ARGV[i + 2] == '1', tonumber(ARGV[i + 3])
  local held = tonumber(redis.call('HGET', KEYS[4], account) or '0')
  local accounts = redis.call('HLEN', KEYS[4])
  if held <= 0 then accounts = accounts + 1 end
  local limit = math.min(ceiling, math.floor(capacity / accounts))
  if limit < 1 and ceiling >= 1 then limit = 1 end
  local total = tonumber(redis.call('GET', KEYS[5]) or '0')
  local stored = 1
  if enforce and (held + cost > limit or total + cost > capacity) then
    stored = 0
  else
    total = total + cost
    redis.call('XADD', key, 'MAXLEN', '~', maxlen, '*', 'type', ARGV[i + 4], 'data', ARGV[i + 5])
    if redis.call('PTTL', key) < ttl then redis.call('PEXPIRE', key, ttl) end
    held = redis.call('HINCRBY', KEYS[4], account, cost)
    redis.call('INCRBY', KEYS[5], cost)
    redis.call('HINCRBY', KEYS[2], key, cost)
    redis.call('HSETNX', KEYS[3], key, account)
    if not redis.call('ZSCORE', KEYS[1], key) then redis.call('ZADD', KEYS[1], now + ttl, key) end
  end
  out[#out + 1] = stored
  out[#out + 1] = held
  out[#out + 1] = limit
  out[#out + 1] = accounts
  out[#out + 1] = capacity - total
end
return out
"""
