"""Scale-out end to end: two real gpu_workers and their Celery executors on one machine sharing
one KV store directory, one private Redis database for heartbeats and events.

A run on worker A writes and pins a named KV file; a reader run on A records the logits after it.
A is SIGKILLed (its executor lives on, as when only the worker process crashes). Runs still routed
to A (its heartbeat has not expired yet) are refused by A's admin socket before anything of them
started: they are re-routed to B within seconds instead of failing, and the reader among them
opens the file on B, which never had it in its catalogue, and gets identical logits. Every run
is billed exactly once. (Concurrent writers on two workers: tests/kvfs/test_coherence.py.)

A test that kills or stops a worker gets a fresh pair (``two_workers``); the tests that only kill
an executor, or kill nothing, share one pair for the module (``kept_workers``, on a Redis database
of its own), each with executors of its own and without the tenant's files of the test before:
starting two workers costs ~30 s here, twice that on a loaded CI machine.
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
from tests.plugins.worker import RunningWorker, start_workers

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.integration,
    pytest.mark.docker,
    pytest.mark.vllm,
]

#: Redis databases of this module alone (the fresh pairs', the kept pair's): other workers on
#: the machine must not be routed to, nor the two pairs to each other.
REDIS_DB = 12
KEPT_REDIS_DB = 13
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


#: The Celery executor of each worker of the fixture, by worker name (its ``Popen``).
EXECUTORS: dict[str, object] = {}


@contextlib.contextmanager
def _executors(workers: list[RunningWorker], redis_url: str, sandbox_image: str, settings) -> Iterator[None]:
    """The Celery executor of each of ``workers`` (three slots each; ``EXECUTORS[name]`` is its
    process), the web side (``settings``) on the pair's Redis."""
    db = settings.DATABASES["default"]
    common = {
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "REDIS_URL": redis_url,
        "SYMPHONY_SANDBOX_IMAGE": sandbox_image,
        "SYMPHONY_ROUTING": "heartbeat",
    }
    settings.REDIS_URL = redis_url
    with contextlib.ExitStack() as stack:
        for w in workers:
            w.assert_alive()
            env = {
                **common,
                "SYMPHONY_WORKER_NAME": w.name,
                "SYMPHONY_WORKER_ADMIN_SOCKET": w.admin_socket,
                "SYMPHONY_SESSIONS_DIR": w.sessions_dir,
            }
            EXECUTORS[w.name] = stack.enter_context(celery_worker(f"worker.{w.name}", env, concurrency=3))
        try:
            yield
        finally:
            EXECUTORS.clear()


@pytest.fixture
def two_workers(tiny_model_dir: Path, tmp_path: Path, sandbox_image: str, settings) -> Iterator[tuple]:
    """Fresh workers ``pair-a`` and ``pair-b`` on one store, each with its executor: for a test
    that kills or stops a worker."""
    redis_url = redis_db_url(REDIS_DB)
    redis.Redis.from_url(redis_url).flushdb()
    with start_workers(
        tiny_model_dir, ["pair-a", "pair-b"], kv_store=tmp_path / "kvstore", redis_url=redis_url
    ) as workers:
        with _executors(workers, redis_url, sandbox_image, settings):
            yield workers[0], workers[1]
    redis.Redis.from_url(redis_url).flushdb()


@pytest.fixture(scope="module")
def _kept_pair(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[RunningWorker]]:
    redis_url = redis_db_url(KEPT_REDIS_DB)
    redis.Redis.from_url(redis_url).flushdb()
    store = tmp_path_factory.mktemp("kept-kvstore")
    with start_workers(tiny_model_dir, ["kept-a", "kept-b"], kv_store=store, redis_url=redis_url) as workers:
        yield workers
    redis.Redis.from_url(redis_url).flushdb()


@pytest.fixture
def kept_workers(
    _kept_pair: list[RunningWorker], sandbox_image: str, settings, api_tenant_a, docker_client
) -> Iterator[tuple]:
    """The module's workers ``kept-a`` and ``kept-b``, with executors of this test's own: for a test
    that kills at most an executor. Left for the next without this test's sandboxes (a run whose
    executor was killed would go on) or the tenant's files."""
    from api.models import Run
    from sandbox.spec import LABEL_RUN

    with _executors(_kept_pair, redis_db_url(KEPT_REDIS_DB), sandbox_image, settings):
        yield _kept_pair[0], _kept_pair[1]
    for run_id in Run.objects.filter(tenant=api_tenant_a.tenant).values_list("pk", flat=True):
        for container in docker_client.containers.list(
            all=True, sparse=True, filters={"label": f"{LABEL_RUN}={run_id}"}
        ):
            with contextlib.suppress(Exception):
                container.remove(force=True)
    for w in _kept_pair:
        w.admin.kv_delete_tenant(api_tenant_a.tenant.slug)


def _live(names: set[str]) -> bool:
    from api.services.routing import live_workers

    return {w.name for w in live_workers()} >= names


def _routable(names: set[str]) -> bool:
    """Each of ``names`` heartbeats and has a live executor."""
    from api.services.routing import candidates

    return {c.worker.name for c in candidates()} >= names


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


QUICK = b"""
import time


def main(args):
    time.sleep(args.get("sleep", 0))
    return {"ok": True}
"""


def _quick_program(tenant):
    from api.models import Program
    from api.services import programs

    prog = Program.objects.create(tenant=tenant, name="quick")
    programs.add_version(prog, "quick.py", QUICK)
    return prog


def _finished(run_id: str, timeout: float = 180):
    from api.models import Run

    wait_for(lambda: Run.objects.get(pk=run_id).status in Run.TERMINAL, timeout=timeout, message=f"run {run_id} to end")
    return Run.objects.get(pk=run_id)


def test_a_dead_executor_strands_no_queued_run(kept_workers, api_tenant_a, settings):
    """Only ``pair-b``'s Celery executor is SIGKILLed; its gpu_worker heartbeats on. New runs go
    to ``pair-a`` once the executor's presence expired, and the runs queued on ``pair-b`` (as a
    stale routing decision left them) are re-routed by ``pair-a``'s executor within
    ``REROUTE_BOUND_S`` and succeed there."""
    from api.models import Plan
    from api.services.executor_presence import REROUTE_BOUND_S
    from api.services.routing import choose_worker
    from api.services.runs import create_run

    a, b = kept_workers
    tenant = api_tenant_a.tenant
    Plan.objects.update_or_create(name="pro", defaults={"max_concurrent_runs": 8})
    tenant.plan = "pro"
    tenant.save()
    prog = _quick_program(tenant)
    wait_for(lambda: _routable({a.name, b.name}), timeout=60, message="both workers and executors to announce")

    executor = EXECUTORS[b.name]
    executor.send_signal(signal.SIGKILL)  # type: ignore[attr-defined]
    executor.wait(timeout=10)  # type: ignore[attr-defined]
    killed_at = time.monotonic()
    assert _live({b.name}), "pair-b's gpu_worker must stay up: only its executor died"
    settings.SYMPHONY_ROUTING, settings.SYMPHONY_WORKER_NAME = "static", b.name
    stranded = [str(create_run(tenant, prog, None, {}, {"deadline_s": 60})[0].pk) for _ in range(2)]
    settings.SYMPHONY_ROUTING = "heartbeat"
    wait_for(lambda: not _routable({b.name}), timeout=REROUTE_BOUND_S, message="pair-b to leave routing")
    assert choose_worker(tenant) == a.name
    fresh = str(create_run(tenant, prog, None, {}, {"deadline_s": 60})[0].pk)

    from api.models import Run

    wait_for(
        lambda: all(Run.objects.get(pk=r).worker == a.name for r in stranded),
        timeout=REROUTE_BOUND_S + 10,
        message="the runs queued on the executor-less worker to move",
    )
    moved_s = time.monotonic() - killed_at
    for run_id in [*stranded, fresh]:
        run = _finished(run_id)
        assert (run.status, run.worker) == ("succeeded", a.name), (run.status, run.error, run.stderr)
    assert moved_s <= REROUTE_BOUND_S + 5, f"queued runs took {moved_s:.1f}s to move (bound {REROUTE_BOUND_S}s)"
    print(f"executor death: queued runs moved {moved_s:.1f}s after the SIGKILL (bound {REROUTE_BOUND_S}s)")


def test_simultaneous_runs_spread_over_both_workers(kept_workers, api_tenant_a, settings):
    """Six runs created at once by one tenant (which holds a pinned file on ``pair-b``, as the
    tenant-wide affinity pulled every run to it) go three and three: by free executor slots."""
    from api.models import Plan, Program
    from api.services import programs
    from api.services.runs import create_run
    from tests.conftest import at_once

    a, b = kept_workers
    tenant = api_tenant_a.tenant
    Plan.objects.update_or_create(name="pro", defaults={"max_concurrent_runs": 8})
    tenant.plan = "pro"
    tenant.save()
    prog = _quick_program(tenant)
    wait_for(lambda: _routable({a.name, b.name}), timeout=60, message="both workers and executors to announce")
    # The pinned file is real (written on pair-b): every sandboxed run's end re-syncs the mirror
    # from its worker, which would drop a row the worker does not hold.
    writer = Program.objects.create(tenant=tenant, name="named-writer")
    programs.add_version(writer, "w.py", NAMED_WRITER)
    settings.SYMPHONY_ROUTING, settings.SYMPHONY_WORKER_NAME = "static", b.name
    wrote = _finished(str(create_run(tenant, writer, None, {"name": "ctx", "prompt": PROMPT[:32]}, {})[0].pk))
    assert (wrote.status, wrote.worker) == ("succeeded", b.name), (wrote.error, wrote.stderr)
    settings.SYMPHONY_ROUTING, settings.SYMPHONY_WORKER_NAME = "heartbeat", a.name

    def submit() -> str:
        return str(create_run(tenant, prog, None, {"sleep": 1}, {"deadline_s": 60})[0].pk)

    run_ids = at_once([submit] * 6)
    runs = [_finished(r) for r in run_ids]
    assert all(r.status == "succeeded" for r in runs), [(r.status, r.error) for r in runs]
    placed = sorted(r.worker for r in runs)
    assert placed == [a.name] * 3 + [b.name] * 3, placed
    # A run that names the file goes where the file is.
    reader = str(create_run(tenant, prog, None, {}, {"kv_files": ["ctx"]})[0].pk)
    assert _finished(reader).worker == b.name


NAMED_WRITER = b"""
from symphony import kv_create, kv_pin, pred


def main(args):
    kv = kv_create(args["name"])
    pred(kv, args["prompt"])[-1].release()
    kv.close()
    kv_pin(args["name"])
    return {"name": args["name"]}
"""


def test_kv_admin_acts_on_the_worker_holding_the_file(kept_workers, api_tenant_a, admin_client, settings):
    """The web process sits with ``pair-a`` (its admin socket); the files live on ``pair-b``.
    Listing shows each file once, unpin and staff evict change ``pair-b``'s own catalogue,
    delete removes the file for good, and with ``pair-b``'s executor dead an operation is a
    503 that changed nothing, never a reported success."""
    from api.models import Program
    from api.services import programs
    from api.services.runs import create_run

    a, b = kept_workers
    tenant = api_tenant_a.tenant
    tenant.plan = "pro"
    tenant.save()
    settings.SYMPHONY_WORKER_NAME, settings.SYMPHONY_WORKER_ADMIN_SOCKET = a.name, a.admin_socket
    wait_for(lambda: _routable({a.name, b.name}), timeout=60, message="both workers and executors to announce")
    prog = Program.objects.create(tenant=tenant, name="named-writer")
    programs.add_version(prog, "w.py", NAMED_WRITER)
    settings.SYMPHONY_ROUTING = "static"
    settings.SYMPHONY_WORKER_NAME = b.name
    for name in ("ctx", "keep"):
        run = _finished(str(create_run(tenant, prog, None, {"name": name, "prompt": PROMPT[:32]}, {})[0].pk))
        assert (run.status, run.worker) == ("succeeded", b.name), (run.error, run.stderr)
    settings.SYMPHONY_ROUTING, settings.SYMPHONY_WORKER_NAME = "heartbeat", a.name

    def on_b() -> dict[str, dict]:
        return {f["name"]: f for f in b.admin.kv_list(tenant.slug)}

    client = api_tenant_a.key_client()
    listed = client.get("/api/v1/kv-files").json()["results"]
    assert [(f["name"], f["worker"], f["pinned"]) for f in listed] == [("ctx", b.name, True), ("keep", b.name, True)]
    ctx, keep = listed

    reply = client.post(f"/api/v1/kv-files/{ctx['id']}/pin", {"pinned": False}, format="json")
    assert reply.status_code == 200, reply.content
    assert on_b()["ctx"]["pinned"] is False

    reply = admin_client.post(f"/api/v1/admin/kv-files/{ctx['id']}/evict")
    assert reply.status_code == 200, reply.content
    assert on_b()["ctx"]["residency"] == "disk"

    assert client.delete(f"/api/v1/kv-files/{ctx['id']}").status_code == 204
    assert "ctx" not in on_b()
    assert "ctx" not in {f["name"] for f in a.admin.kv_list(tenant.slug)}
    assert [f["name"] for f in client.get("/api/v1/kv-files").json()["results"]] == ["keep"]  # no row came back

    executor = EXECUTORS[b.name]
    executor.send_signal(signal.SIGKILL)  # type: ignore[attr-defined]
    executor.wait(timeout=10)  # type: ignore[attr-defined]
    from api.services.executor_presence import TTL_S

    wait_for(lambda: not _routable({b.name}), timeout=TTL_S + 5, message="pair-b's executor to leave")
    reply = client.post(f"/api/v1/kv-files/{keep['id']}/pin", {"pinned": False}, format="json")
    assert reply.status_code == 503, reply.content
    assert on_b()["keep"]["pinned"] is True  # nothing happened, and nothing said it did


LONG_RUN = b"""
import time

from symphony import kv_create, pred


def main(args):
    kv = kv_create("bill")
    for i in range(400):
        pred(kv, [40 + i % 900, 41, 42, 43])[-1].release()
        time.sleep(0.1)
    return {"done": True}
"""


def test_a_run_whose_executor_died_is_billed_for_what_its_session_used(kept_workers, api_tenant_a, settings):
    """``pair-b``'s executor is SIGKILLed mid-run; the reaper (beat's task, called here as beat
    would) fails the run and bills the usage ``pair-b`` checkpointed for its session."""
    from api.models import Program, Run, UsageRecord
    from api.services import programs
    from api.services.runs import create_run, reap_orphaned_runs
    from gpu_worker import contracts

    a, b = kept_workers
    tenant = api_tenant_a.tenant
    wait_for(lambda: _routable({a.name, b.name}), timeout=60, message="both workers and executors to announce")
    prog = Program.objects.create(tenant=tenant, name="long")
    programs.add_version(prog, "long.py", LONG_RUN)
    settings.SYMPHONY_ROUTING, settings.SYMPHONY_WORKER_NAME = "static", b.name
    run_id = str(create_run(tenant, prog, None, {}, {"deadline_s": 120})[0].pk)
    settings.SYMPHONY_ROUTING = "heartbeat"
    store = redis.Redis.from_url(settings.REDIS_URL)

    def used() -> dict:
        return contracts.decode_usage_checkpoint(store.get(contracts.usage_checkpoint_key(run_id)))

    wait_for(lambda: used().get("pred_calls", 0) >= 5, timeout=120, message="the run to checkpoint some usage")
    executor = EXECUTORS[b.name]
    executor.send_signal(signal.SIGKILL)  # type: ignore[attr-defined]
    executor.wait(timeout=10)  # type: ignore[attr-defined]
    time.sleep(3)  # the session's last checkpoint (its sandbox may run on for a moment)

    def reaped() -> bool:
        reap_orphaned_runs()
        return Run.objects.get(pk=run_id).status in Run.TERMINAL

    wait_for(reaped, timeout=90, interval=2, message="the reaper to fail the run")
    run = Run.objects.get(pk=run_id)
    assert run.status == "failed" and "Celery executor" in run.error, run.error
    record = UsageRecord.objects.get(run_id=run_id)
    last = used()
    assert record.pred_calls >= 5 and record.prefill_tokens > 0, (record.pred_calls, record.prefill_tokens)
    assert record.pred_calls <= last["pred_calls"]
    print(f"billed after executor death: pred_calls={record.pred_calls} prefill_tokens={record.prefill_tokens}")


def test_drain_then_remove_a_worker(two_workers, api_tenant_a, settings, tmp_path):
    """The documented procedure (docs/DEPLOY.md, "Drain and remove a worker") on ``pair-b``:
    drained, it takes no new run, its queued run moves, its running run finishes there; its
    executor and gpu_worker are stopped with SIGTERM (the worker flushes its named file); once
    removed, its KV rows are gone, the file it wrote opens on ``pair-a`` from the store, and
    deleting that file is not stuck on a 503."""
    from django.core.management import call_command

    from api.models import KVFile, Program, Run
    from api.services import programs
    from api.services.routing import choose_worker
    from api.services.runs import create_run

    a, b = two_workers
    tenant = api_tenant_a.tenant
    tenant.plan = "pro"
    tenant.save()
    settings.SYMPHONY_WORKER_NAME, settings.SYMPHONY_WORKER_ADMIN_SOCKET = a.name, a.admin_socket
    wait_for(lambda: _routable({a.name, b.name}), timeout=60, message="both workers and executors to announce")
    writer = Program.objects.create(tenant=tenant, name="named-writer")
    programs.add_version(writer, "w.py", NAMED_WRITER)
    reader = Program.objects.create(tenant=tenant, name="reader")
    programs.add_version(reader, "r.py", READER)
    quick = _quick_program(tenant)

    settings.SYMPHONY_ROUTING, settings.SYMPHONY_WORKER_NAME = "static", b.name
    wrote = _finished(str(create_run(tenant, writer, None, {"name": "ctx", "prompt": PROMPT}, {})[0].pk))
    assert (wrote.status, wrote.worker) == ("succeeded", b.name), (wrote.error, wrote.stderr)
    long_run = str(create_run(tenant, quick, None, {"sleep": 8}, {"deadline_s": 60})[0].pk)
    wait_for(lambda: Run.objects.get(pk=long_run).status == "running", timeout=60, message="the long run to start")
    settings.SYMPHONY_ROUTING, settings.SYMPHONY_WORKER_NAME = "heartbeat", a.name

    out = tmp_path / "drain.txt"
    with open(out, "w") as stream:
        call_command("workers", "drain", b.name, stdout=stream)
    assert choose_worker(tenant) == a.name
    fresh = str(create_run(tenant, quick, None, {}, {})[0].pk)
    with open(out, "w") as stream:
        call_command("workers", "drain", b.name, "--wait", "60", stdout=stream)
    assert "idle=True" in out.read_text(), out.read_text()
    finished_there = Run.objects.get(pk=long_run)
    assert (finished_there.status, finished_there.worker) == ("succeeded", b.name), finished_there.error
    assert _finished(fresh).worker == a.name

    executor = EXECUTORS[b.name]
    executor.terminate()  # type: ignore[attr-defined]
    executor.wait(timeout=30)  # type: ignore[attr-defined]
    b.proc.terminate()
    b.proc.wait(timeout=60)
    wait_for(lambda: not _live({b.name}), timeout=20, message="pair-b's heartbeat to go")
    assert KVFile.objects.filter(tenant=tenant, worker=b.name, name="ctx").exists()

    with open(out, "w") as stream:
        call_command("workers", "remove", b.name, stdout=stream)
    assert not KVFile.objects.filter(worker=b.name).exists()

    read = _finished(str(create_run(tenant, reader, None, {}, {"kv_files": ["ctx"]})[0].pk))
    assert (read.status, read.worker) == ("succeeded", a.name), (read.error, read.stderr)
    client = api_tenant_a.key_client()
    listed = client.get("/api/v1/kv-files").json()["results"]
    (ctx,) = [f for f in listed if f["name"] == "ctx"]
    assert client.delete(f"/api/v1/kv-files/{ctx['id']}").status_code == 204
    assert "ctx" not in {f["name"] for f in client.get("/api/v1/kv-files").json()["results"]}


HOLDING_WRITER = b"""
import time

from symphony import kv_create, kv_open, pred, send_to_user


def main(args):
    kv = kv_create("log")
    pred(kv, args["prompt"])[-1].release()
    kv.close()  # generation 1 in the store
    kv = kv_open("log", "w")  # takes the write lease again
    pred(kv, [7, 8, 9])[-1].release()  # appends that are never flushed
    send_to_user("holding")
    time.sleep(args["hold"])
    return {"closed": False}
"""

LEASE_WAITER = b"""
import time

from symphony import Busy, kv_len, kv_open


def main(args):
    tries, busy = 0, None
    while True:
        tries += 1
        try:
            kv = kv_open("log", "w")
            break
        except Busy as exc:
            busy = str(exc)
            time.sleep(0.5)
    opened_at = time.time()
    n = kv_len(kv)
    kv.close()
    return {"tries": tries, "busy": busy, "opened_at": opened_at, "len": n}
"""


def test_a_dead_workers_write_lease_is_free_when_it_expires(two_workers, api_tenant_a, settings):
    """A worker SIGKILLed while a run holds a named file open for writing leaves the lease in the
    store: the other worker's writer gets ``Busy`` until the lease's ``expires`` (at most the
    lease TTL after the last renewal), then opens the file at its last flushed generation (the
    dead worker's unflushed appends are lost, as docs/DEPLOY.md says)."""
    import json

    from api.models import Program, Run
    from api.services import programs
    from api.services.runs import create_run
    from gpu_worker.kvfs.lease import DEFAULT_LEASE_TTL_S

    a, b = two_workers
    tenant = api_tenant_a.tenant
    tenant.plan = "pro"
    tenant.save()
    holder, waiter = (
        Program.objects.create(tenant=tenant, name="holder"),
        Program.objects.create(tenant=tenant, name="waiter"),
    )
    programs.add_version(holder, "h.py", HOLDING_WRITER)
    programs.add_version(waiter, "w.py", LEASE_WAITER)

    settings.SYMPHONY_ROUTING, settings.SYMPHONY_WORKER_NAME = "static", a.name
    held = str(create_run(tenant, holder, None, {"prompt": PROMPT, "hold": 90}, {"deadline_s": 110})[0].pk)
    store = Path(a.kv_store)

    def lease() -> dict | None:
        found = list(store.glob("**/log.lease"))
        return json.loads(found[0].read_bytes()) if found else None

    wait_for(
        lambda: (
            Run.objects.get(pk=held).status == "running"
            and (lease() or {}).get("owner") is not None
            and (lease() or {}).get("generation") == 1
        ),
        timeout=120,
        message="the run on pair-a to hold the write lease of generation 1",
    )
    a.proc.send_signal(signal.SIGKILL)
    a.proc.wait(timeout=10)
    killed_at = time.time()
    expires = lease()["expires"]  # type: ignore[index]
    assert expires - killed_at <= DEFAULT_LEASE_TTL_S

    settings.SYMPHONY_WORKER_NAME = b.name
    waited = _finished(str(create_run(tenant, waiter, None, {}, {"deadline_s": 120})[0].pk))
    assert (waited.status, waited.worker) == ("succeeded", b.name), (waited.error, waited.stderr)
    out = waited.result
    assert out["tries"] > 1 and "open for writing" in out["busy"], out
    assert expires - 0.5 <= out["opened_at"] <= expires + 5, (out["opened_at"] - expires, out)
    assert out["len"] == len(PROMPT), out  # the last flushed generation, not the lost appends
    print(f"lease: free {out['opened_at'] - killed_at:.1f}s after the SIGKILL ({out['tries']} tries)")
