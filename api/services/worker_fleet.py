"""Operator procedures on the workers of a running stack: drain one, then remove it.

Draining ``<name>`` adds it to ``symphony:workers-draining`` (no expiry: it stays until the
worker is removed or undrained). Routing gives a draining worker no new runs
(api/services/routing.py), the stranded-run reaper moves the runs still queued on it to the
others, and its running runs finish where they are. :func:`drain_state` says when it is idle;
the operator then stops its executor (SIGTERM: Celery's warm shutdown) and its gpu_worker
(SIGTERM: it flushes its named files to the store before it exits). docs/DEPLOY.md has the
procedure.

Removing ``<name>`` (a worker stopped for good) deletes its KV mirror rows (the files stay in the
shared store and any live worker opens them) and its routing keys. A file whose only row was
the removed worker's is deleted through a live worker (api/services/kvfiles.py); the write
leases the worker held on the store expire by themselves (the KV store's lease TTL).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings

from api import redis_client
from api.models import KVFile, Run
from api.services import executor_presence, routing
from api.services.runs import reroute_stranded
from gpu_worker import contracts

draining = routing.draining


class FleetError(Exception):
    """An operator request that cannot be carried out as asked."""


def _redis():
    return redis_client.shared(settings.REDIS_URL)


@dataclass(frozen=True)
class DrainState:
    worker: str
    draining: bool
    running: int
    queued: int
    heartbeat: bool
    executor: bool

    @property
    def idle(self) -> bool:
        """Nothing of it runs or waits any more: its executor and gpu_worker may be stopped."""
        return self.draining and self.running == 0 and self.queued == 0


def drain_state(worker: str) -> DrainState:
    runs = Run.objects.filter(worker=worker)
    return DrainState(
        worker=worker,
        draining=worker in draining(),
        running=runs.filter(status="running").count(),
        queued=runs.filter(status="queued").count(),
        heartbeat=worker in {w.name for w in routing.live_workers()},
        executor=routing.has_executor(worker),
    )


def drain(worker: str) -> DrainState:
    """No new runs for ``worker`` from now; its queued runs move to other workers now."""
    _redis().sadd(routing.DRAINING_KEY, worker)
    reroute_stranded()
    return drain_state(worker)


def undrain(worker: str) -> DrainState:
    _redis().srem(routing.DRAINING_KEY, worker)
    return drain_state(worker)


@dataclass(frozen=True)
class Removal:
    worker: str
    kv_rows: int


def remove(worker: str) -> Removal:
    """Forget a stopped worker: its KV mirror rows and routing keys. Refused while it still
    heartbeats, has a live executor or has runs that are not finished (drain it and stop it
    first)."""
    state = drain_state(worker)
    if state.heartbeat or state.executor:
        raise FleetError(f"worker {worker!r} is still up (heartbeat={state.heartbeat}, executor={state.executor})")
    if state.running or state.queued:
        raise FleetError(f"worker {worker!r} still has {state.running} running and {state.queued} queued runs")
    rows, _ = KVFile.objects.filter(worker=worker).delete()
    client = _redis()
    stale = [contracts.heartbeat_key(worker), routing.UNAVAILABLE_PREFIX + worker]
    stale += list(client.scan_iter(match=f"{executor_presence.PREFIX}{worker}:*", count=100))
    client.delete(*stale)
    client.srem(routing.DRAINING_KEY, worker)
    return Removal(worker, rows)
