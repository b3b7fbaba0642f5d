"""Hostile-tenant soak: one free tenant runs every known exhaustion attack at once, through the
real stack, while a second tenant's canary runs keep succeeding within 1.5x of their idle time;
afterwards the stack is healthy and nothing leaked.

The attacks (each has its own failing-then-passing regression test elsewhere; see the resource
table in docs/SECURITY.md): over HTTP, many concurrent event streams of one run, simultaneous
run creations past the plan's concurrency, a large streamed upload, wrong API keys under forged
``X-Forwarded-For`` values; inside its LIP, ``send_to_user`` of large messages until refused,
thousands of pipelined calls whose replies it never reads, hundreds of session connections
without ``hello`` (some holding partial frames), pinning named KV files until refused, a grammar
whose compilation blows up, and 48 threads of tiny ``pred`` calls.

Self-stopping: the attack window is ``ATTACK_S``; every loop checks it, every request has a
timeout, all traffic goes to 127.0.0.1 and the worker's Unix sockets.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import requests
from django.conf import settings as django_settings
from django.db import connection

from api import redis_client
from tests.conftest import container_names, wait_for
from tests.plugins.api import ApiTenant, _make_tenant
from tests.plugins.worker import RunningWorker, start_worker
from tests.reliability import attack_clients
from tests.reliability.attack_clients import Attacker

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.integration,
    pytest.mark.docker,
    pytest.mark.vllm,
    pytest.mark.timeout(900),
]

#: How long the hostile tenant attacks.
ATTACK_S = 45.0
#: A canary under attack may take this many times its idle (median) time...
CANARY_BOUND = 1.5
#: ...or one step of this many seconds more. A cold canary run lasts either ~1.05 s or ~2.1 s on
#: the 2-core test host, by the host's state and not by load: the same code measured idle
#: medians of 1.04-1.08 s in some runs and 2.05-2.11 s in others, with ~2.1 s under attack in
#: both. A ratio of one such step is noise; real harm is several (the flood defect was 3.4x).
RUN_TIME_STEP_S = 1.2
#: Threads of the hostile LIP that flood the worker with one-token ``pred`` calls.
PRED_THREADS = 48
CELERY_CONCURRENCY = 4
#: The web process's PostgreSQL pool (``DATABASE_POOL_MAX_SIZE``): connections it keeps, idle,
#: for up to a minute after the attack's requests filled it.
WEB_DB_POOL = 8

CANARY = b"""
import symphony as sy


def main(args):
    kv = sy.kv_create()
    out = sy.generate(kv, sy.tokenize("The canary sings a short song about the sea"), max_tokens=24)
    return {"tokens": out}
"""

HOSTILE = b"""
import os
import socket
import struct
import threading
import time

import msgpack

import symphony as sy
from symphony.connection import DEFAULT_SOCKET, ENV_SOCKET, ENV_TOKEN
from symphony.errors import SymphonyError

SOCKET = os.environ.get(ENV_SOCKET) or DEFAULT_SOCKET
TOKEN = os.environ.get(ENV_TOKEN, "")


def frame(req_id, op, args):
    body = msgpack.packb({"id": req_id, "op": op, "args": args}, use_bin_type=True)
    return struct.pack(">I", len(body)) + body


def main(args):
    stop = time.monotonic() + args["seconds"]
    refused = {}
    lock = threading.Lock()

    def note(kind, exc):
        with lock:
            refused.setdefault(kind, f"{type(exc).__name__}: {exc}"[:300])

    def big_messages():
        blob = "\\u00e9" * 500_000  # escaped x6 in JSON
        while time.monotonic() < stop:
            try:
                sy.send_to_user(blob)
            except SymphonyError as exc:
                note("send_to_user", exc)
                return

    def unread_replies():
        try:
            s = socket.socket(socket.AF_UNIX)
            s.connect(SOCKET)
            s.sendall(frame(1, "hello", {"token": TOKEN}))
            s.settimeout(0.5)
            burst = b"".join(frame(i, "vocab_info", {}) for i in range(2, 1002))
            while time.monotonic() < stop:
                s.sendall(burst)  # blocks once the worker stops reading: back-pressure
        except OSError as exc:
            note("unread_replies", exc)

    def idle_connections():
        held = []
        try:
            for i in range(300):
                if time.monotonic() >= stop:
                    break
                c = socket.socket(socket.AF_UNIX)
                c.connect(SOCKET)
                if i % 10 == 0:  # a partial 8 MiB frame: header and a little of the body
                    c.sendall(struct.pack(">I", 8 * 1024 * 1024) + b"x" * 65536)
                held.append(c)
        except OSError as exc:
            note("idle_connections", exc)
        while time.monotonic() < stop:
            time.sleep(0.5)
        for c in held:
            c.close()

    def pins():
        for i in range(10_000):
            if time.monotonic() >= stop:
                return
            try:
                kv = sy.kv_create(f"hoard-{i}")
                sy.pred(kv, list(range(100, 100 + 64)))[-1].release()
                sy.kv_pin(f"hoard-{i}", True)
                sy.kv_close(kv)
            except SymphonyError as exc:
                note("pins", exc)
                return

    def grammar_bomb():
        schema = {
            "type": "object",
            "properties": {f"p{i}": {"type": "string", "pattern": "^(([a-z]{1,20}){1,20}){1,20}$"} for i in range(8)},
            "required": [f"p{i}" for i in range(8)],
        }
        try:
            sy.grammar(json_schema=schema)
        except SymphonyError as exc:
            note("grammar", exc)

    def tiny_preds():
        kv = sy.kv_create()
        sy.pred(kv, [1, 2, 3])[-1].release()
        while time.monotonic() < stop:
            try:
                sy.pred(kv, [5])[-1].release()
                sy.kv_truncate(kv, 3)
            except SymphonyError as exc:
                note("tiny_preds", exc)
                time.sleep(0.05)

    workers = [big_messages, unread_replies, idle_connections, pins, grammar_bomb]
    workers += [tiny_preds] * args["pred_threads"]
    threads = [threading.Thread(target=fn, daemon=True) for fn in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.1, stop - time.monotonic() + 5))
    return {"refused": refused}
"""


@pytest.fixture
def stack_worker(tiny_model_dir: Path) -> Iterator[RunningWorker]:
    with start_worker(tiny_model_dir, name=f"soak{uuid.uuid4().hex[:4]}", num_pages=256) as worker:
        yield worker


@pytest.fixture
def stack_env() -> dict[str, str]:
    """Cold sandboxes only, so "no container left" is exact; the web process's database pool at
    :data:`WEB_DB_POOL`, which the attack fills and the leak check allows for."""
    return {"SYMPHONY_SANDBOX_POOL_SIZE": "0", "DATABASE_POOL_MAX_SIZE": str(WEB_DB_POOL)}


@pytest.fixture
def stack_concurrency() -> int:
    """The hostile tenant's two runs and the canary's at once."""
    return CELERY_CONCURRENCY


class Tenant:
    """One tenant's API key and its uploaded program, over HTTP."""

    def __init__(
        self, base_url: str, slug: str, program: bytes, record: ApiTenant | None = None, name: str = "p"
    ) -> None:
        self.base_url = base_url
        self.record = record or _make_tenant(slug)
        self.headers = {"Authorization": f"Bearer {self.record.key_secret}"}
        files = {"file": ("p.py", program)}
        r = requests.post(
            f"{base_url}/api/v1/programs", headers=self.headers, data={"name": name}, files=files, timeout=30
        )
        assert r.status_code == 201, r.text
        self.program = r.json()["id"]

    def start(self, args: dict, deadline_s: float = 120) -> requests.Response:
        body = {"program": self.program, "args": args, "limits": {"deadline_s": deadline_s}}
        return requests.post(f"{self.base_url}/api/v1/runs", headers=self.headers, json=body, timeout=30)

    def wait(self, run_id: str, timeout: float = 240) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            run = requests.get(f"{self.base_url}/api/v1/runs/{run_id}", headers=self.headers, timeout=30).json()
            if run["status"] in ("succeeded", "failed", "cancelled", "timed_out"):
                return run
            time.sleep(0.2)
        pytest.fail(f"run {run_id} did not finish within {timeout}s")


def _seconds(run: dict) -> float:
    from django.utils.dateparse import parse_datetime

    return (parse_datetime(run["finished_at"]) - parse_datetime(run["started_at"])).total_seconds()


def _canary(canary: Tenant) -> tuple[float, dict]:
    r = canary.start({})
    assert r.status_code == 201, r.text
    run = canary.wait(r.json()["id"])
    assert run["status"] == "succeeded", run
    assert len(run["result"]["tokens"]) == 24, run["result"]
    return _seconds(run), run


def _db_connections() -> int:
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
        return int(cur.fetchone()[0])


def _redis_connections() -> dict[str, int]:
    """Established connections to Redis per holding process, this test process left out (its
    own clients come and go with the test's polling; the stack's processes are what may leak)."""
    port = redis.Redis.from_url(django_settings.REDIS_URL).connection_pool.connection_kwargs.get("port", 6379)
    out = subprocess.run(
        ["ss", "-tnpH", "state", "established", f"( dport = :{port} )"], capture_output=True, text=True, timeout=10
    ).stdout
    holders: dict[str, int] = {}
    for line in out.splitlines():
        users = line.split("users:")[-1] if "users:" in line else "?"
        if f"pid={os.getpid()}," in users:
            continue
        name = users.split(",fd=")[0]
        holders[name] = holders.get(name, 0) + 1
    return holders


def _redis_clients() -> int:
    return sum(_redis_connections().values())


def _http_attacks(base_url: str, hostile: Tenant, run_id: str, stop: float) -> dict[str, list[int]]:
    """Every HTTP attack at once until ``stop``, from this process; the status codes each got."""
    return attack_clients.http_attacks(base_url, Attacker(hostile.record.key_secret, hostile.program, run_id), stop)


def test_a_hostile_tenant_leaves_another_tenants_runs_unharmed(stack, stack_worker, docker_client) -> None:
    base_url = stack
    hostile = Tenant(base_url, f"hostile-{uuid.uuid4().hex[:4]}", HOSTILE)
    canary = Tenant(base_url, f"canary-{uuid.uuid4().hex[:4]}", CANARY)
    baseline_health = stack_worker.admin.health()
    _canary(canary)  # warm-up: first sandbox start and first prefill
    idle = statistics.median(_canary(canary)[0] for _ in range(3))
    db_before, redis_before = _db_connections(), _redis_clients()

    # The hostile LIP, then every HTTP attack at once while it runs; the canary meanwhile.
    attack = hostile.start({"seconds": ATTACK_S, "pred_threads": PRED_THREADS}, deadline_s=ATTACK_S + 60)
    assert attack.status_code == 201, attack.text
    attack_id = attack.json()["id"]
    stop = time.monotonic() + ATTACK_S
    box: dict = {}
    http = threading.Thread(target=lambda: box.update(codes=_http_attacks(base_url, hostile, attack_id, stop)))
    http.start()
    time.sleep(3)  # the flood is under way
    under_attack = []
    while time.monotonic() < stop - 2:
        under_attack.append(_canary(canary)[0])
    http.join(timeout=120)
    hostile_run = hostile.wait(attack_id)

    ratio = statistics.median(under_attack) / idle
    print(
        f"\nsoak: canary idle {idle:.2f}s, under attack {[round(t, 2) for t in under_attack]} "
        f"(median ratio {ratio:.2f}x, bound {CANARY_BOUND}x); hostile refused: "
        f"{json.dumps((hostile_run.get('result') or {}).get('refused'))}; http: "
        f"{ {k: sorted(set(v)) for k, v in box.get('codes', {}).items()} }"
    )
    assert under_attack, "no canary run finished during the attack"
    allowed = max(CANARY_BOUND * idle, idle + RUN_TIME_STEP_S)
    assert statistics.median(under_attack) <= allowed, (idle, under_attack, allowed)

    # The attacker got clear refusals, not a stack that gave way.
    codes = box["codes"]
    assert 429 in codes["streams"], codes["streams"]
    assert all(c in (200, 429) for c in codes["streams"]), codes["streams"]
    assert all(c in (201, 429) for c in codes["race"]), codes["race"]
    assert codes["upload"] and all(c in (0, 400, 413) for c in codes["upload"]), codes["upload"]
    assert 429 in codes["forged"], codes["forged"]
    refused = (hostile_run.get("result") or {}).get("refused") or {}
    assert "send_to_user" in refused, hostile_run

    # Healthy afterwards, and nothing leaked.
    assert requests.get(f"{base_url}/api/v1/health", timeout=10).json()["status"] == "ok"
    _canary(canary)
    # Slack: each Celery thread may hold one connection of each kind once it has executed a run,
    # and the web process's pool keeps what the attack made it open (at most its bound).
    slack = CELERY_CONCURRENCY + 2 + WEB_DB_POOL
    wait_for(lambda: _db_connections() <= db_before + slack, timeout=60, message="database connections released")
    # The web process keeps its bounded cache pool (SYMPHONY_CACHE_MAX_CONNECTIONS) and its
    # asyncio pool's idle connections (api/redis_client.py, ASYNC_MAX_IDLE) once the attack has
    # filled them; past those bounds, a connection left behind is a leak.
    cache_pool = django_settings.CACHES["default"]["OPTIONS"]["max_connections"]
    slack = CELERY_CONCURRENCY + 2 + cache_pool + redis_client.ASYNC_MAX_IDLE
    deadline = time.monotonic() + 60
    while _redis_clients() > redis_before + slack and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _redis_clients() <= redis_before + slack, (redis_before, _redis_connections())
    from api.models import Run
    from sandbox.spec import LABEL_RUN

    run_ids = [
        str(pk)
        for pk in Run.objects.filter(tenant__in=[hostile.record.tenant, canary.record.tenant]).values_list(
            "pk", flat=True
        )
    ]
    wait_for(
        lambda: not [n for rid in run_ids for n in container_names(docker_client, label=f"{LABEL_RUN}={rid}")],
        timeout=60,
        interval=0.5,
        message="every run's sandbox container removed",
    )
    health = stack_worker.admin.health()
    assert health["sessions"] == 0, health
    assert not list(Path(stack_worker.sessions_dir).glob("*.sock"))
    for f in stack_worker.admin.kv_list(hostile.record.tenant.slug):
        stack_worker.admin.kv_delete(hostile.record.tenant.slug, f["name"])
    assert stack_worker.admin.health()["pages_free"] == baseline_health["pages_free"]
    fds = len(os.listdir(f"/proc/{stack_worker.proc.pid}/fd"))
    print(f"soak: worker fds after {fds}")
    stack_worker.assert_alive()
