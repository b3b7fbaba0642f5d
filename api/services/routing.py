"""Which worker runs a run: among the workers that can take it, the one holding the files the run
said it will open, else the one with the most free executor slots, then the most free pages.

A worker can take a run when its gpu_worker heartbeats and a Celery executor consumes its queue.
Each gpu_worker writes ``symphony:worker:<name>`` every couple of seconds with a short TTL
(``gpu_worker/contracts.py``, the heartbeat contract); each executor consuming ``worker.<name>``
writes ``symphony:executor-up:<name>:<node>`` (api/services/executor_presence.py). A worker
whose heartbeat expired is dead for routing, its running runs are failed by
:func:`api.services.runs.reap_orphaned_runs`; a worker without an executor gets no new runs and
its queued ones are re-routed by the same reaper.

Files: a run names the KV files it will open in its ``kv_files`` limit, and a Responses turn's
run opens its chain's file (``args.conversation.name``). Only those count: a tenant's other
files do not pull its every run to one worker. Free slots are the worker's executor slots less
its runs queued or running (counted in the database, so runs routed a moment ago count too);
routing decisions are serialised by an advisory lock so simultaneous runs spread.

An executor that finds its worker's admin socket refused does not wait for the heartbeat to
expire: :func:`mark_unavailable` deletes the heartbeat and sets ``symphony:worker-down:<name>``
for as long as a heartbeat lives, so routing skips the dead worker within the second.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import redis
from django.conf import settings
from django.db.models import Count

from api import redis_client
from api.models import KVFile, Run, Tenant
from api.services import executor_presence
from gpu_worker import contracts

log = logging.getLogger(__name__)

#: Affinity weight of a file a run will open by where it lives on a worker: a device-resident
#: file saves a reload, a host-resident one a disk read; disk files can be read by any worker
#: sharing the store, so they count little.
RESIDENCY_WEIGHT = {"device": 4, "host": 2, "disk": 1}
#: ``<prefix><name>`` marks a worker an executor found unreachable; it outlives any heartbeat
#: the worker wrote before it died, so a stale heartbeat cannot route runs back to it.
UNAVAILABLE_PREFIX = "symphony:worker-down:"
UNAVAILABLE_TTL_S = contracts.HEARTBEAT_TTL_S
#: The set of the names of the workers being drained (api/services/worker_fleet.py): they get
#: no new runs. No expiry: a name stays until the worker is removed or undrained.
DRAINING_KEY = "symphony:workers-draining"


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


def files_of(run: Run) -> list[str]:
    """The KV files ``run`` said it will open: its ``kv_files`` limit, and the chain file of a
    Responses turn (``args.conversation.name``)."""
    names = [str(n) for n in (run.limits or {}).get("kv_files") or [] if isinstance(n, str)]
    conversation = (run.args or {}).get("conversation")
    if isinstance(conversation, dict) and isinstance(conversation.get("name"), str):
        names.append(conversation["name"])
    return names


def kv_affinity(tenant: Tenant, files: Iterable[str]) -> Counter:
    """Score per worker name from where the named files of ``tenant`` live (none: no score)."""
    score: Counter = Counter()
    names = list(files)
    if not names:
        return score
    rows = KVFile.objects.filter(tenant=tenant, name__in=names).values_list("worker", "residency", "pinned")
    for worker, residency, pinned in rows:
        score[worker] += RESIDENCY_WEIGHT.get(residency, 0) + (2 if pinned else 0)
    return score


@dataclass(frozen=True)
class Candidate:
    """A worker that can take a run now, with its load."""

    worker: WorkerInfo
    slots: int
    assigned: int

    @property
    def free_slots(self) -> int:
        return self.slots - self.assigned


def candidates(exclude: Iterable[str] = ()) -> list[Candidate]:
    """Healthy heartbeating workers with a live executor, not being drained
    (api/services/worker_fleet.py), and how loaded each one is; empty when Redis cannot be read."""
    skip = set(exclude)
    live = [w for w in live_workers() if w.ok and w.name not in skip]
    if not live:
        return []
    try:
        slots = executor_presence.executor_slots_by_worker()
    except redis.RedisError as exc:
        log.warning("executor_presence_unreadable error=%s", exc)
        return []
    try:
        drained = draining()
    except redis.RedisError:
        return []
    live = [w for w in live if slots.get(w.name, 0) > 0 and w.name not in drained]
    assigned = dict(
        Run.objects.filter(status__in=("queued", "running"), worker__in=[w.name for w in live])
        .values_list("worker")
        .annotate(n=Count("id"))
        .values_list("worker", "n")
    )
    return [Candidate(w, slots[w.name], int(assigned.get(w.name, 0))) for w in live]


def draining() -> set[str]:
    """Names of the workers being drained. Raises RedisError."""
    members = redis_client.shared(settings.REDIS_URL).smembers(DRAINING_KEY)
    return {m.decode() if isinstance(m, bytes) else str(m) for m in members}


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


def choose_worker(tenant: Tenant, exclude: Iterable[str] = (), files: Iterable[str] = ()) -> str:
    """The worker name for a new run of ``tenant``; the configured local worker when no worker
    can take it (the run then waits in that worker's queue until one can). ``exclude``: workers
    a re-routed run already found unreachable; ``files``: the KV files the run will open."""
    if settings.SYMPHONY_ROUTING == "static":
        return settings.SYMPHONY_WORKER_NAME
    able = candidates(exclude)
    if not able:
        return settings.SYMPHONY_WORKER_NAME
    affinity = kv_affinity(tenant, files)
    best = max(
        able,
        key=lambda c: (
            affinity[c.worker.name],
            c.free_slots,
            c.worker.pages_free,
            -c.worker.sessions,
            c.worker.name,
        ),
    )
    return best.worker.name


def has_executor(worker: str) -> bool:
    """Whether a live executor consumes ``worker``'s queue. Raises RedisError."""
    return executor_presence.executor_slots_by_worker().get(worker, 0) > 0
