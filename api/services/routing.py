"""Which worker runs a run: live workers from their Redis heartbeats, preferring the one that
already holds the tenant's KV files (KV affinity), then the one with the most free pages.

Each gpu_worker writes ``symphony:worker:<name>`` every couple of seconds with a short TTL
(``gpu_worker/contracts.py``, the heartbeat contract), and one Celery queue ``worker.<name>`` is
consumed next to it. A worker whose key expired is dead for routing; its running runs are
failed by :func:`api.services.runs.reap_orphaned_runs`.

An executor that finds its worker's admin socket refused does not wait for the heartbeat to
expire: :func:`mark_unavailable` deletes the heartbeat and sets ``symphony:worker-down:<name>``
for as long as a heartbeat lives, so routing skips the dead worker within the second.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

import redis
from django.conf import settings

from api import redis_client
from api.models import KVFile, Tenant
from gpu_worker import contracts

log = logging.getLogger(__name__)

#: Affinity weight of a tenant's KV file by where it lives on a worker: a device-resident file
#: saves a reload, a host-resident one a disk read; disk files can be read by any worker
#: sharing the store, so they count little.
RESIDENCY_WEIGHT = {"device": 4, "host": 2, "disk": 1}
#: ``<prefix><name>`` marks a worker an executor found unreachable; it outlives any heartbeat
#: the worker wrote before it died, so a stale heartbeat cannot route runs back to it.
UNAVAILABLE_PREFIX = "symphony:worker-down:"
UNAVAILABLE_TTL_S = contracts.HEARTBEAT_TTL_S


@dataclass(frozen=True)
class WorkerInfo:
    name: str
    pages_free: int
    pages_total: int
    sessions: int
    ok: bool
    #: The whole heartbeat (the worker's ``health`` answer: device, model, scheduler metrics).
    health: dict = field(default_factory=dict, compare=False)


def live_workers() -> list[WorkerInfo]:
    """Workers with an unexpired heartbeat; empty when Redis cannot be read."""
    try:
        client = redis_client.shared(settings.REDIS_URL)
        keys = list(client.scan_iter(match=contracts.HEARTBEAT_PREFIX + "*", count=100))
        values = client.mget(keys) if keys else []
        down = {
            key.decode()[len(UNAVAILABLE_PREFIX) :] if isinstance(key, bytes) else key[len(UNAVAILABLE_PREFIX) :]
            for key in client.scan_iter(match=UNAVAILABLE_PREFIX + "*", count=100)
        }
    except redis.RedisError as exc:
        log.warning("worker_heartbeats_unreadable error=%s", exc)
        return []
    workers = []
    for value in values:
        if value is None:
            continue  # expired between SCAN and MGET
        beat = contracts.decode_heartbeat(value)
        if beat.name in down:
            continue
        workers.append(WorkerInfo(beat.name, beat.pages_free, beat.pages_total, beat.sessions, beat.ok, beat.health))
    return workers


def kv_affinity(tenant: Tenant) -> Counter:
    """Score per worker name from the tenant's mirrored KV files."""
    score: Counter = Counter()
    for worker, residency, pinned in KVFile.objects.filter(tenant=tenant).values_list("worker", "residency", "pinned"):
        score[worker] += RESIDENCY_WEIGHT.get(residency, 0) + (2 if pinned else 0)
    return score


def mark_unavailable(name: str, reason: str) -> bool:
    """Take ``name`` out of routing now (its admin socket refused a connection): its heartbeat
    is deleted and a marker keeps it out until a heartbeat would have expired anyway. A worker
    that is in fact alive announces itself again once the marker is gone. False when Redis
    cannot be written (routing then learns of the death at heartbeat expiry, as before)."""
    try:
        client = redis_client.shared(settings.REDIS_URL)
        pipe = client.pipeline()
        pipe.set(UNAVAILABLE_PREFIX + name, reason[:500], ex=UNAVAILABLE_TTL_S)
        pipe.delete(contracts.heartbeat_key(name))
        pipe.execute()
    except redis.RedisError as exc:
        log.warning("worker_mark_unavailable_failed worker=%s error=%s", name, exc)
        return False
    log.warning("worker_marked_unavailable worker=%s reason=%s", name, reason)
    return True


def choose_worker(tenant: Tenant, exclude: frozenset[str] | set[str] = frozenset()) -> str:
    """The worker name for a new run of ``tenant``; the configured local worker when no worker
    has announced itself (the run then waits in that worker's queue until it starts).
    ``exclude``: workers a re-routed run already found unreachable."""
    if settings.SYMPHONY_ROUTING == "static":
        return settings.SYMPHONY_WORKER_NAME
    live = [w for w in live_workers() if w.ok and w.name not in exclude]
    if not live:
        return settings.SYMPHONY_WORKER_NAME
    affinity = kv_affinity(tenant)
    best = max(live, key=lambda w: (affinity[w.name], w.pages_free, -w.sessions, w.name))
    return best.name
