"""B12 routing — where the control plane sends runs when it has two workers, and what that buys.

``bench/b12_scaleout.py`` (B12's socket-only row) feeds two worker processes itself, prompts
split by hand: it never exercises routing. This benchmark drives the **whole control plane**
(uvicorn, a Celery executor per worker consuming only its queue ``worker.<name>``, as
``scripts/run_stack.py`` starts ``SYMPHONY_WORKERS=2``, and ``SYMPHONY_ROUTING=heartbeat``):
api/services/routing.py picks each run's worker from the heartbeats, the executors' free slots
and the KV files the run declares.

* **Symphony** (the side under test): two workers ``b12-a`` and ``b12-b``, each with
  ``slots`` executor slots, a warm sandbox per slot (``warm``), ``pages`` device KV pages, a
  maximum batch of ``slots`` and half the host's CPUs as forward threads (``OMP_NUM_THREADS``).
* **Baseline**: the same stack with ONE worker ``b12-one`` holding the two's total: twice the
  slots, warm sandboxes, pages, batch and forward threads. So both sides have the same
  executor slots, KV bytes, forward threads and CPUs (the protocol's equal resources, read from
  the running workers); what differs is that the two side's compute is split in two engines.

Each side's stack is a control plane of its own: its PostgreSQL database (``DATABASE_URL``'s
name with :data:`DB_SUFFIX`, created and migrated if needed) and its Redis database for
heartbeats, executor presence and event streams (:data:`REDIS_DBS`, flushed when the benchmark
starts). Shared, a stack's executors would take the other's queued runs for stranded ones
(their worker has no heartbeat they can see) and re-route them to their own. Only the Celery
broker is shared (the queues are per worker). The benchmark reads everything through each
stack's REST API (runs, the KV file mirror); only a tenant is made with Django, in a
subprocess on the stack's database.

Workload (fixed before the first measurement), per repetition and side, through the REST API:

* **no files**: ``runs`` runs submitted at once (one client thread each), each a small LIP
  (``bench/b12_run.py``): a fresh KV, ``prompt_tokens`` prefilled, ``out_tokens`` greedy
  tokens decoded (EOS ignored), every run's tokens its own.
* **pinned file**: before the repetitions a setup run prefills ``file_tokens`` into a named
  file and pins it; it lands where routing sends it, and the control plane's mirror of the
  workers' catalogues (``KVFile``) names that worker: *the file's worker*. Each repetition
  then submits ``runs // 2`` runs that declare the file (``limits.kv_files``) and open it
  read-only, all at once, and as soon as those are accepted the other runs at once. The file's
  runs must all go to its worker (a run elsewhere cannot open it and fails); the rest should
  fill the other worker.

Figures per repetition, from the run rows: where each run went (``Run.worker``), the spread
(runs per worker, the busier worker's share), queue wait p50/p90 (``started_at - created_at``),
and runs/s (``runs`` over the time from the first request to the last ``finished_at``). The
ratio is two workers ÷ one. On a CPU host both workers' forwards share the same cores, so
throughput cannot double there (the printed arithmetic says by how much it can move); what
routing controls is the spread, which the targets judge (bench/results.py).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from typing import Any

import numpy as np

from bench.b9_swarm import client_sdk
from bench.control_plane import Processes, control_plane_env, database_ready
from bench.harness import (
    ROOT,
    BenchConfig,
    BenchResult,
    Comparison,
    WorkerOptions,
    WorkerProcess,
    config_dict,
    max_len_for,
    random_tokens,
    repetition_starts,
    run_threads,
    workload_args,
)
from bench.resources import combined

NAME = "b12_routing"
#: The benchmark tenants' plan (created or updated by the benchmark, used by its tenants only).
PLAN = "bench-b12"
#: The Redis database of each side's stack (heartbeats, executor presence, run events).
REDIS_DBS = {"two": 10, "one": 11}
#: Suffix of each side's PostgreSQL database name.
DB_SUFFIX = {"two": "_b12r_two", "one": "_b12r_one"}
TWO = ("b12-a", "b12-b")
ONE = "b12-one"
RUN_DEADLINE_S = 600
#: Seconds to wait for the executors' warm pools to refill, and for a stack to be routable.
POOL_FILL_S = 300.0
ROUTABLE_S = 120.0
BLOCK = 128
#: Target of the no-files case: the busier worker's share of the runs, every repetition.
SPREAD_BOUND = 0.6


@dataclass(frozen=True)
class Workload:
    """Sizes of one run of B12 routing; ``slots`` and ``warm`` are per worker of the two."""

    runs: int = 16
    prompt_tokens: int = 64
    out_tokens: int = 32
    file_tokens: int = 256
    slots: int = 4
    #: Warm gVisor sandboxes per executor slot (0: every run starts a cold one).
    warm: int = 1

    def longest(self) -> int:
        return self.file_tokens + self.prompt_tokens + self.out_tokens

    def pages(self) -> int:
        """Device pages of one of the two workers: page 0, the pinned file, and per slot a run's
        own pages (a fork's copied partial page included)."""
        own = -(-(self.prompt_tokens + self.out_tokens) // BLOCK) + 2
        return 1 + -(-self.file_tokens // BLOCK) + self.slots * own + 1


QUICK = Workload(runs=6, prompt_tokens=16, out_tokens=8, file_tokens=64, slots=2, warm=0)


# ------------------------------------------------------------------------------ stacks
def redis_url_of(db: int) -> str:
    """``REDIS_URL`` with its database replaced by ``db``."""
    base = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    head, _, tail = base.rpartition("/")
    return f"{head}/{db}" if tail.isdigit() else f"{base.rstrip('/')}/{db}"


def database_url_of(suffix: str) -> str:
    """``DATABASE_URL`` with ``suffix`` appended to its database name."""
    base = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/symphony")
    head, _, name = base.rpartition("/")
    name, _, query = name.partition("?")
    return f"{head}/{name}{suffix}" + (f"?{query}" if query else "")


def stack_database(url: str) -> None:
    """The stack's database created and migrated, and no run of an earlier, interrupted
    benchmark left queued or running in it: its executors would pick those up."""
    import psycopg

    database_ready(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "UPDATE api_run SET status = 'cancelled', finished_at = now(), error = %s "
            "WHERE status IN ('queued', 'running')",
            ["left over by an interrupted B12 routing benchmark"],
        )


@dataclass
class Stack:
    """One side's control plane as the benchmark sees it."""

    label: str
    workers: list[WorkerProcess]
    redis_url: str
    database_url: str
    url: str = ""
    key: str = ""
    program: int = 0
    #: (Celery pid, warm pool size) per executor.
    executors: list[tuple[int, int]] = field(default_factory=list)
    #: Where the pinned file lives (the mirror's worker for it), and its name.
    holder: str = ""
    file: str = ""

    @property
    def names(self) -> list[str]:
        return [w.opts.name for w in self.workers]

    def client(self) -> Any:
        return client_sdk()(self.url, self.key, timeout=120)


def worker_options(cfg: BenchConfig, wl: Workload, name: str, share: int, redis_url: str) -> WorkerOptions:
    """A worker of ``share`` parts (1: one of the two, 2: the one), with ``share`` times one
    part's pages, batch and forward threads."""
    threads = max(1, (os.cpu_count() or 2) // 2) * share
    max_len = max_len_for(wl.longest())
    return WorkerOptions(
        model=cfg.model,
        num_pages=max(wl.pages(), max_len // BLOCK + 2) * share,
        dtype=cfg.dtype,
        max_model_len=max_len,
        max_num_seqs=wl.slots * share,
        name=name,
        env=(("REDIS_URL", redis_url), ("OMP_NUM_THREADS", str(threads))),
    )


def tenant_key(database_url: str, wl: Workload) -> str:
    """A fresh tenant's API key on the stack of ``database_url`` (a subprocess: the benchmark
    process itself has no Django, and two stacks mean two databases)."""
    code = f"from bench.b12_routing import _tenant, Workload; print(_tenant(Workload(runs={wl.runs})))"
    env = control_plane_env(DATABASE_URL=database_url)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"making the tenant failed:\n{out.stderr[-3000:]}")
    return out.stdout.strip().splitlines()[-1]


def _tenant(wl: Workload) -> str:
    """A fresh tenant on :data:`PLAN` and a plaintext API key of it. The plan admits every run
    of a wave at once and pins without a share bound (the pinned file)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "web.settings")
    import django

    django.setup()
    from django.contrib.auth import get_user_model

    from api.models import Membership, Plan, Tenant
    from api.services.keys import issue_key
    from api.tenancy import KEY_SCOPES

    limits = {
        "max_concurrent_runs": 4 * wl.runs,
        "max_tokens_per_run": 32768,
        "max_run_seconds": RUN_DEADLINE_S,
        "tokens_per_month": None,
        "api_requests_per_minute": None,
        "max_concurrent_streams": 256,
        "max_device_pages_per_run": None,
        "max_kv_files": None,
        "kv_pinned_device_share": None,
    }
    Plan.objects.update_or_create(name=PLAN, defaults=limits)
    slug = f"b12-{uuid.uuid4().hex[:8]}"
    tenant = Tenant.objects.create(name=slug, slug=slug, plan=PLAN)
    user = get_user_model().objects.create_user(username=f"{slug}@example.com", email=f"{slug}@example.com")
    Membership.objects.create(user=user, tenant=tenant, role="owner")
    return issue_key(tenant, "b12", list(KEY_SCOPES), user).secret


def start_stack(procs: Processes, stack: Stack, wl: Workload, share: int, image: str) -> None:
    """Per worker a Celery executor consuming only ``worker.<name>`` (``slots * share`` threads,
    ``warm`` sandboxes a slot), and one uvicorn routing between them by heartbeat."""
    slots = wl.slots * share
    common = {
        "DATABASE_URL": stack.database_url,
        "REDIS_URL": stack.redis_url,
        "SYMPHONY_ROUTING": "heartbeat",
        "SYMPHONY_SANDBOX_IMAGE": image,
    }
    for w in stack.workers:
        name = w.opts.name
        env = control_plane_env(
            **common,
            SYMPHONY_WORKER_NAME=name,
            SYMPHONY_WORKER_ADMIN_SOCKET=w.admin_socket,
            SYMPHONY_SESSIONS_DIR=str(w.base / "s"),
            SYMPHONY_SANDBOX_POOL_SIZE=str(wl.warm * slots),
        )
        argv = [sys.executable, "-m", "celery", "-A", "web", "worker", "-Q", f"worker.{name}", "--pool", "threads"]
        argv += ["--concurrency", str(slots), "--hostname", f"celery-{name}@%h", "--loglevel", "WARNING"]
        proc = procs.start(f"celery-{name}", [*argv, "--without-gossip", "--without-mingle"], env)
        stack.executors.append((proc.pid, wl.warm * slots))
    first = stack.workers[0]
    web_env = control_plane_env(
        **common,
        SYMPHONY_WORKER_NAME=first.opts.name,
        SYMPHONY_WORKER_ADMIN_SOCKET=first.admin_socket,
        SYMPHONY_SESSIONS_DIR=str(first.base / "s"),
    )
    stack.url = procs.web(f"web-{stack.label}", web_env)
    wait_routable(stack)
    stack.key = tenant_key(stack.database_url, wl)
    client = stack.client()
    stack.program = int(client.upload_program(ROOT / "bench" / "b12_run.py", name="b12-run")["id"])
    client.close()


def wait_routable(stack: Stack) -> None:
    """Until every worker of ``stack`` heartbeats and has an executor announced (what routing
    needs before it sends a worker anything), read from the stack's own Redis database."""
    import redis

    from api.services.executor_presence import PREFIX
    from gpu_worker.contracts import heartbeat_key

    client = redis.Redis.from_url(stack.redis_url)
    deadline = time.monotonic() + ROUTABLE_S
    try:
        while True:
            beats = all(client.exists(heartbeat_key(n)) for n in stack.names)
            executors = all(next(client.scan_iter(match=f"{PREFIX}{n}:*"), None) for n in stack.names)
            if beats and executors:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{stack.label}: workers {stack.names} not routable after {ROUTABLE_S}s")
            time.sleep(0.5)
    finally:
        client.close()


def wait_for_pools(stack: Stack) -> None:
    """Block until each executor's warm pool is full again: a wave starts from full pools (the
    refill after the last wave is not timed against either side)."""
    if not any(size for _, size in stack.executors):
        return
    import docker

    from sandbox.spec import LABEL_OWNER, LABEL_POOL

    client = docker.from_env()
    deadline = time.monotonic() + POOL_FILL_S
    try:
        for pid, size in stack.executors:
            filters = {"label": [f"{LABEL_POOL}=1", f"{LABEL_OWNER}={socket.gethostname()}:{pid}"], "status": "running"}
            while len(client.containers.list(sparse=True, filters=filters)) < size:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{stack.label}: a warm pool did not reach {size} containers in {POOL_FILL_S}s")
                time.sleep(0.5)
    finally:
        client.close()


# ------------------------------------------------------------------------------- waves
@dataclass(frozen=True)
class Job:
    args: dict[str, Any]
    limits: dict[str, Any]
    declares_file: bool = False


@dataclass
class Wave:
    """One wave's runs as their rows say."""

    per_worker: dict[str, int]
    runs_per_s: float
    queue_p50_s: float
    queue_p90_s: float
    #: Share of the file's runs routed to the file's worker; of the rest, to another worker.
    file_on_holder: float | None = None
    rest_elsewhere: float | None = None

    @property
    def busier_share(self) -> float:
        return max(self.per_worker.values()) / sum(self.per_worker.values())


def jobs_for(wl: Workload, seed: int, rep: int, file: str | None) -> list[list[Job]]:
    """The waves' batches: every run at once, or (``file``) the file's runs then the rest."""
    base = {"out_tokens": wl.out_tokens}
    limits: dict[str, Any] = {"deadline_s": RUN_DEADLINE_S}
    runs = [
        Job({**base, "prompt": random_tokens(wl.prompt_tokens, seed, 120, rep, i, int(file is not None))}, limits)
        for i in range(wl.runs)
    ]
    if file is None:
        return [runs]
    half = wl.runs // 2
    declared = [Job({**j.args, "file": file}, {**limits, "kv_files": [file]}, True) for j in runs[:half]]
    return [declared, runs[half:]]


def submit(stack: Stack, batches: list[list[Job]]) -> tuple[float, list[tuple[str, Job]]]:
    """Each batch's runs created at once (a client thread each, started together); the next
    batch once the last one's requests were answered (by then each of its runs was routed).
    Returns the wall time of the first request and (run id, job) per run."""
    clients = [stack.client() for _ in range(max(len(b) for b in batches))]
    created: list[tuple[str, Job]] = []
    started = time.time()
    try:
        for batch in batches:
            gate = threading.Barrier(len(batch))

            def create(client: Any, job: Job, gate: threading.Barrier = gate) -> tuple[str, Job]:
                gate.wait()
                return str(client.create_run(stack.program, args=job.args, limits=job.limits)["id"]), job

            created += run_threads([lambda c=c, j=j: create(c, j) for c, j in zip(clients, batch, strict=False)])
    finally:
        for client in clients:
            client.close()
    return started, created


@dataclass(frozen=True)
class Row:
    """What a wave needs of a run's row, as ``GET /runs`` serves it."""

    worker: str
    created_at: float
    started_at: float
    finished_at: float

    @classmethod
    def of(cls, run: dict[str, Any]) -> Row:
        def at(key: str) -> float:
            return datetime.fromisoformat(str(run[key]).replace("Z", "+00:00")).timestamp()

        return cls(str(run["worker"]), at("created_at"), at("started_at"), at("finished_at"))


TERMINAL = {"succeeded", "failed", "timed_out", "cancelled"}


def finished_rows(stack: Stack, run_ids: list[str], timeout_s: float = RUN_DEADLINE_S) -> dict[str, Row]:
    """The runs' rows once all have ended (one ``GET /runs`` listing a poll); fails unless
    every one succeeded."""
    client = stack.client()
    deadline = time.monotonic() + timeout_s
    wanted = set(run_ids)
    try:
        while True:
            runs = {r["id"]: r for r in client.list_runs(limit=len(run_ids) + 8) if r["id"] in wanted}
            if len(runs) == len(wanted) and all(r["status"] in TERMINAL for r in runs.values()):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{stack.label}: runs still not ended after {timeout_s}s")
            time.sleep(0.25)
        bad = [r for r in runs.values() if r["status"] != "succeeded"]
        if bad:
            logs = [client.get_run(r["id"]) for r in bad[:3]]
            why = [f"{r['id']} on {r['worker']}: {r['status']} {r.get('error', '')[:300]}" for r in logs]
            raise RuntimeError(f"{stack.label}: {len(bad)} of {len(runs)} runs did not succeed: {why}")
    finally:
        client.close()
    return {rid: Row.of(run) for rid, run in runs.items()}


def wave(stack: Stack, batches: list[list[Job]], full_pools: bool = True) -> Wave:
    """Submit ``batches`` to ``stack``, wait for every run, and read where each one went.
    ``full_pools``: first wait until the warm pools are full (an executor starts its pool on
    its first run, so the warm-up wave cannot)."""
    if full_pools:
        wait_for_pools(stack)
    started, created = submit(stack, batches)
    rows = finished_rows(stack, [rid for rid, _ in created])
    per_worker = Counter(dict.fromkeys(stack.names, 0))
    per_worker.update(rows[rid].worker for rid, _ in created)
    waits = [r.started_at - r.created_at for r in rows.values()]
    last = max(r.finished_at for r in rows.values())
    out = Wave(
        per_worker=dict(per_worker),
        runs_per_s=len(rows) / (last - started),
        queue_p50_s=float(np.percentile(waits, 50)),
        queue_p90_s=float(np.percentile(waits, 90)),
    )
    declared = [rows[rid].worker for rid, job in created if job.declares_file]
    if declared:
        rest = [rows[rid].worker for rid, job in created if not job.declares_file]
        out.file_on_holder = sum(w == stack.holder for w in declared) / len(declared)
        out.rest_elsewhere = sum(w != stack.holder for w in rest) / len(rest) if rest else None
    return out


def place_file(stack: Stack, wl: Workload, seed: int) -> None:
    """The setup run: prefill and pin the pinned case's file wherever routing sends it, then
    read which worker holds it from the control plane's mirror (written as the run ends)."""
    stack.file = f"b12-ctx-{uuid.uuid4().hex[:8]}"
    context = random_tokens(wl.file_tokens, seed, 121)
    job = Job({"setup": True, "file": stack.file, "context": context}, {"deadline_s": RUN_DEADLINE_S})
    _, created = submit(stack, [[job]])
    finished_rows(stack, [created[0][0]])
    client = stack.client()
    deadline = time.monotonic() + 60
    try:
        while not (held := [f for f in client.list_kv_files() if f["name"] == stack.file]):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{stack.label}: the KV file mirror never listed {stack.file}")
            time.sleep(0.25)
    finally:
        client.close()
    if len(held) != 1 or not held[0]["pinned"]:
        raise RuntimeError(f"{stack.label}: {stack.file} mirrored as {[(f['worker'], f['pinned']) for f in held]}")
    stack.holder = str(held[0]["worker"])


# ------------------------------------------------------------------------------- run
@dataclass
class Case:
    """The rows of one case (no files, or the pinned file) and its per-repetition detail."""

    rate: Comparison
    p50: Comparison
    p90: Comparison
    detail: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def named(cls, title: str) -> Case:
        return cls(
            Comparison(f"{title}: 2 workers / 1", "runs/s"),
            Comparison(f"queue wait p50, {title}", "s", higher_is_better=False),
            Comparison(f"queue wait p90, {title}", "s", higher_is_better=False),
        )

    def add(self, side: str, w: Wave) -> None:
        getattr(self.rate, side).add(w.runs_per_s)
        getattr(self.p50, side).add(w.queue_p50_s)
        getattr(self.p90, side).add(w.queue_p90_s)


def arithmetic(wl: Workload) -> str:
    """What the host allows the ratio to be, printed beside it."""
    cpus = os.cpu_count() or 1
    each = max(1, cpus // 2)
    return (
        f"{cpus} CPUs: the one worker's forward runs {2 * each} threads on them, each of the two workers' "
        f"{each} thread(s) on the same {cpus}; the same compute split in two engines, not added, so runs/s "
        f"two / one can reach about 1x here, not 2x (a host with a device per worker: up to 2x, less the "
        f"spread). Slots: {wl.slots} + {wl.slots} vs {2 * wl.slots}. What routing controls is the spread."
    )


def run(two: Stack, one: Stack, cfg: BenchConfig, wl: Workload, result: BenchResult) -> None:
    """A warm-up wave a side, then interleaved repetitions (two, one; then one, two) of both
    cases, each repetition with fresh prompts."""
    plain = Case.named(f"{wl.runs} runs at once, no files")
    pinned = Case.named(f"{wl.runs} runs at once, half declare a pinned file")
    for stack in (two, one):
        place_file(stack, wl, cfg.seed)
        # Warm-up, untimed: every executor starts its pool and every worker its first forwards.
        wave(stack, jobs_for(replace(wl, runs=2 * wl.slots), cfg.seed, 1_000, None), full_pools=False)
    print(f"  b12r: file on {two.holder} (two) / {one.holder} (one); warmed up ({time.strftime('%H:%M:%S')})")
    sides = [("symphony", two), ("baseline", one)]
    for rep in range(cfg.reps):
        repetition_starts()
        order = sides if rep % 2 == 0 else list(reversed(sides))
        for case, file_of in ((plain, False), (pinned, True)):
            for side, stack in order:
                w = wave(stack, jobs_for(wl, cfg.seed, rep, stack.file if file_of else None))
                case.add(side, w)
                if side == "symphony":
                    case.detail.append(asdict(w) | {"busier_share": w.busier_share})
                print(
                    f"  b12r: rep {rep} {stack.label} {'pinned' if file_of else 'plain'} {w.runs_per_s:.3f} runs/s "
                    f"{w.per_worker} queue p50 {w.queue_p50_s:.2f}s p90 {w.queue_p90_s:.2f}s "
                    f"file->holder {w.file_on_holder} rest->other {w.rest_elsewhere} ({time.strftime('%H:%M:%S')})",
                    flush=True,
                )
    plain.rate.extra.update(
        runs_per_worker=[d["per_worker"] for d in plain.detail],
        busier_share=[d["busier_share"] for d in plain.detail],
        target=f"busier worker <= {SPREAD_BOUND:.0%} of the runs in every repetition",
        cpus=os.cpu_count(),
    )
    pinned.rate.extra.update(
        runs_per_worker=[d["per_worker"] for d in pinned.detail],
        busier_share=[d["busier_share"] for d in pinned.detail],
        file_runs_on_holder=[d["file_on_holder"] for d in pinned.detail],
        rest_on_other_worker=[d["rest_elsewhere"] for d in pinned.detail],
        holder=two.holder,
        target="every run declaring the file on the file's worker",
        cpus=os.cpu_count(),
    )
    for case in (plain, pinned):
        case.p50.extra["note"] = case.p90.extra["note"] = "started_at - created_at of the run rows"
        result.comparisons += [case.rate, case.p50, case.p90]
    result.notes.append(arithmetic(wl))
    result.notes.append(
        f"pinned case: {wl.runs // 2} runs declaring the file (limits.kv_files) at once, then the other "
        f"{wl.runs - wl.runs // 2} at once; the file was placed by routing on {two.holder} (two) by a setup run"
    )
    shares = [d["busier_share"] for d in plain.detail]
    result.notes.append(
        f"no files: busier worker's share {min(shares):.0%}-{max(shares):.0%} over the repetitions; "
        f"runs per worker {plain.detail[0]['per_worker']} in the first"
    )


@contextlib.contextmanager
def stacks(cfg: BenchConfig, wl: Workload) -> Iterator[tuple[Stack, Stack]]:
    """Both sides' workers and control planes, up until the block exits."""
    import redis

    from sandbox.image import ensure

    urls = {label: redis_url_of(db) for label, db in REDIS_DBS.items()}
    for url in urls.values():  # the benchmark's own databases: no stale heartbeat routes a run
        redis.Redis.from_url(url).flushdb()
    dbs = {label: database_url_of(suffix) for label, suffix in DB_SUFFIX.items()}
    two_workers = [WorkerProcess(worker_options(cfg, wl, n, 1, urls["two"])) for n in TWO]
    two = Stack("two", two_workers, urls["two"], dbs["two"])
    one = Stack("one", [WorkerProcess(worker_options(cfg, wl, ONE, 2, urls["one"]))], urls["one"], dbs["one"])
    workers = [*two.workers, *one.workers]
    procs = Processes()
    try:
        for url in dbs.values():
            stack_database(url)
        image = ensure(log=lambda m: None)
        for w in workers:
            w.wait_ready()
        start_stack(procs, two, wl, 1, image)
        start_stack(procs, one, wl, 2, image)
        try:
            yield two, one
        except Exception:
            for name, _, _ in procs.procs:
                print(f"--- {name} log tail:\n{procs.tail(name)}", file=sys.stderr)
            raise
    finally:
        procs.close()
        for w in workers:
            w.close()


def main(argv: list[str] | None = None) -> int:
    cfg, wl = workload_args(argv, __doc__ or NAME, Workload(), QUICK)
    if min(wl.runs, wl.prompt_tokens, wl.out_tokens, wl.file_tokens, wl.slots) < 1 or wl.runs < 2 or wl.warm < 0:
        raise SystemExit("b12r: every size >= 1, runs >= 2 (warm may be 0)")
    started = time.perf_counter()
    result = BenchResult(NAME, config_dict(cfg, **asdict(wl)))
    print(f"  b12r: {arithmetic(wl)}", flush=True)
    with stacks(cfg, wl) as (two, one):
        pages = {"device_pages_each": two.workers[0].opts.num_pages, "device_pages_one": one.workers[0].opts.num_pages}
        result.config.update(pages)
        run(two, one, cfg, wl, result)
        result.sides = {
            "symphony": combined([w.resources() for w in two.workers]),
            "baseline": one.workers[0].resources(),
        }
        result.memory = {w.opts.name: w.memory() for w in [*two.workers, *one.workers]}
    result.wall_s = time.perf_counter() - started
    result.print()
    print(f"  wrote {result.write()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
