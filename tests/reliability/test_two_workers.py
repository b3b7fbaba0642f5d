"""Scale-out end to end: two real gpu_workers and their Celery executors on one machine sharing
one KV store directory, one private Redis database for heartbeats and events.

A run on worker A writes and pins a named KV file; a reader run on A records the logits after it.
A is SIGKILLed (its executor lives on, as when only the worker process crashes). Runs still routed
to A (its heartbeat has not expired yet) are refused by A's admin socket before anything of them
started: they are re-routed to B within seconds instead of failing, and the reader among them
opens the file on B, which never had it in its catalogue, and gets identical logits. Every run
is billed exactly once. (Concurrent writers on two workers: tests/kvfs/test_coherence.py.)
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.conftest import celery_worker, redis_db_url, wait_for
from tests.plugins.worker import RunningWorker, start_worker

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.integration,
    pytest.mark.docker,
    pytest.mark.vllm,
]

#: A Redis database of this test alone: other workers on the machine must not be routed to.
REDIS_DB = 12
PROMPT = [(17 * i + 5) % 3000 + 40 for i in range(96)]

WRITER = b"""
from symphony import kv_create, kv_pin, pred


def main(args):
    kv = kv_create("ctx")
    pred(kv, args["prompt"])[-1].release()
    kv.close()
    kv_pin("ctx")
    return {"tokens": len(args["prompt"])}
"""

READER = b"""
from symphony import kv_open, pred


def main(args):
    kv = kv_open("ctx", "r")
    top = pred(kv, [42])[-1].topk(8)
    return {"ids": list(top.ids), "logprobs": list(top.logprobs)}
"""


@pytest.fixture
def two_workers(tiny_model_dir: Path, tmp_path: Path, sandbox_image: str, settings) -> Iterator[tuple]:
    """Workers ``pair-a`` and ``pair-b`` on one store, each with the executor consuming its queue."""
    redis_url = redis_db_url(REDIS_DB)
    redis.Redis.from_url(redis_url).flushdb()
    db = settings.DATABASES["default"]
    store = tmp_path / "kvstore"
    common = {
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "REDIS_URL": redis_url,
        "SYMPHONY_SANDBOX_IMAGE": sandbox_image,
        "SYMPHONY_ROUTING": "heartbeat",
    }
    settings.REDIS_URL = redis_url
    with contextlib.ExitStack() as stack:
        workers: list[RunningWorker] = [
            stack.enter_context(start_worker(tiny_model_dir, name=name, kv_store=store, redis_url=redis_url))
            for name in ("pair-a", "pair-b")
        ]
        for w in workers:
            env = {
                **common,
                "SYMPHONY_WORKER_NAME": w.name,
                "SYMPHONY_WORKER_ADMIN_SOCKET": w.admin_socket,
                "SYMPHONY_SESSIONS_DIR": w.sessions_dir,
            }
            stack.enter_context(celery_worker(f"worker.{w.name}", env))
        yield workers[0], workers[1]
    redis.Redis.from_url(redis_url).flushdb()


def _live(names: set[str]) -> bool:
    from api.services.routing import live_workers

    return {w.name for w in live_workers()} >= names


def test_a_killed_worker_loses_no_queued_run_and_no_file(two_workers, api_tenant_a, settings, tmp_path):
    from api.models import Program, Run, UsageRecord
    from api.services import programs
    from api.services.runs import create_run

    a, b = two_workers
    tenant = api_tenant_a.tenant
    tenant.plan = "pro"  # three runs at once
    tenant.save()
    wait_for(lambda: _live({a.name, b.name}), timeout=30, message="both workers to heartbeat")

    def program(name: str, source: bytes) -> Program:
        prog = Program.objects.create(tenant=tenant, name=name)
        programs.add_version(prog, f"{name}.py", source)
        return prog

    writer, reader = program("writer", WRITER), program("reader", READER)

    def run_on(worker: str, prog: Program, args: dict) -> str:
        """A run routed to ``worker`` (as KV affinity or a stale heartbeat would)."""
        settings.SYMPHONY_ROUTING, settings.SYMPHONY_WORKER_NAME = "static", worker
        return str(create_run(tenant, prog, None, args, {"deadline_s": 120})[0].pk)

    def finished(run_id: str) -> Run:
        wait_for(lambda: Run.objects.get(pk=run_id).status in Run.TERMINAL, timeout=180, message=f"run {run_id} to end")
        return Run.objects.get(pk=run_id)

    wrote = finished(run_on(a.name, writer, {"prompt": PROMPT}))
    assert (wrote.status, wrote.worker) == ("succeeded", a.name), (wrote.status, wrote.error, wrote.stderr)
    before = finished(run_on(a.name, reader, {}))
    assert (before.status, before.worker) == ("succeeded", a.name), (before.error, before.stderr)
    assert [f["pinned"] for f in a.admin.kv_list(tenant.slug) if f["name"] == "ctx"] == [True]

    a.proc.send_signal(signal.SIGKILL)
    a.proc.wait(timeout=10)
    killed_at = time.monotonic()
    assert _live({a.name}), "the dead worker's heartbeat is still live: these runs are routed to it"
    moved = [run_on(a.name, reader, {}), run_on(a.name, reader, {})]
    wait_for(
        lambda: all(Run.objects.get(pk=r).worker == b.name for r in moved),
        timeout=30,
        message="the runs queued on the dead worker to move to the live one",
    )
    rerouted_s = time.monotonic() - killed_at
    after = [finished(r) for r in moved]
    done_s = time.monotonic() - killed_at
    for run in after:
        assert (run.status, run.worker) == ("succeeded", b.name), (run.status, run.error, run.stderr)
        assert run.result["ids"] == before.result["ids"]
        assert run.result["logprobs"] == pytest.approx(before.result["logprobs"], abs=1e-4)
    assert not _live({a.name}), "the dead worker is still routed to"
    assert rerouted_s < 20, f"queued runs took {rerouted_s:.1f}s to move (heartbeat expiry alone is 10s+)"
    for run_id in [str(wrote.pk), str(before.pk), *moved]:
        assert UsageRecord.objects.filter(run_id=run_id).count() == 1
    print(f"failover: queued runs moved {rerouted_s:.1f}s and finished {done_s:.1f}s after the SIGKILL")
