"""Which worker runs a run: live workers from their Redis heartbeats, preferring the one that
already holds the tenant's KV files (KV affinity), then the one with the most free pages.

Each gpu_worker writes ``symphony:worker:<name>`` every couple of seconds with a short TTL, and
one Celery queue ``worker.<name>`` is consumed next to it. A worker whose key expired is dead
for routing; its running runs are failed by :func:`api.services.runs.reap_orphaned_runs`.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass, field

import redis
from django.conf import settings

from api.models import KVFile, Tenant
from gpu_worker.events import HEARTBEAT_PREFIX

log = logging.getLogger(__name__)

#: Affinity weight of a tenant's KV file by where it lives on a worker: a device-resident file
#: saves a reload, a host-resident one a disk read; disk files can be read by any worker
#: sharing the store, so they count little.
RESIDENCY_WEIGHT = {"device": 4, "host": 2, "disk": 1}


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
        client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2)
        keys = list(client.scan_iter(match=HEARTBEAT_PREFIX + "*", count=100))
        values = client.mget(keys) if keys else []
    except redis.RedisError as exc:
        log.warning("worker_heartbeats_unreadable error=%s", exc)
        return []
    workers = []
    for value in values:
        if value is None:
            continue  # expired between SCAN and MGET
        info = json.loads(value)
        workers.append(
            WorkerInfo(
                name=str(info["name"]),
                pages_free=int(info.get("pages_free", 0)),
                pages_total=int(info.get("pages_total", 0)),
                sessions=int(info.get("sessions", 0)),
                ok=bool(info.get("ok", False)),
                health=info,
            )
        )
    return workers


def kv_affinity(tenant: Tenant) -> Counter:
    """Score per worker name from the tenant's mirrored KV files."""
    score: Counter = Counter()
    for worker, residency, pinned in KVFile.objects.filter(tenant=tenant).values_list("worker", "residency", "pinned"):
        score[worker] += RESIDENCY_WEIGHT.get(residency, 0) + (2 if pinned else 0)
    return score


def choose_worker(tenant: Tenant) -> str:
    """The worker name for a new run of ``tenant``; the configured local worker when no worker
    has announced itself (the run then waits in that worker's queue until it starts)."""
    if settings.SYMPHONY_ROUTING == "static":
        return settings.SYMPHONY_WORKER_NAME
    live = [w for w in live_workers() if w.ok]
    if not live:
        return settings.SYMPHONY_WORKER_NAME
    affinity = kv_affinity(tenant)
    best = max(live, key=lambda w: (affinity[w.name], w.pages_free, -w.sessions, w.name))
    return best.name
