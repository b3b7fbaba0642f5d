"""Load: 50 runs from 5 tenants at once through the real stack.

uvicorn (ASGI) takes the submissions over HTTP on 127.0.0.1, a Celery worker with a thread pool
of ``CELERY_CONCURRENCY`` executes them (the shared ``stack`` fixture with ``stack_concurrency``;
its default, one run at a time, would make this a sequential test), each run is a gVisor container talking to a
private gpu_worker (tiny model) that batches their ``pred`` calls.

After everything finished:

* every run ``succeeded`` and returned its 16 tokens;
* each tenant was billed exactly its decode tokens (10 runs x 16), so within 10% of the fair
  share, and while all five tenants had runs in flight none got less than half its fair share
  of streamed tokens (nobody starved behind the others);
* nothing leaked: no container labelled with one of the runs, the worker has no session left
  and every KV page is free again (admin ``health``/``stats``), and no session socket remains.

Self-stopping: submissions are bounded (50), and waiting for them is bounded by ``DEADLINE_S``;
the module is ``slow`` (``make test-all``), a few minutes on 2 cores.
"""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis
from django.conf import settings as django_settings

from tests.conftest import container_names, wait_for
from tests.plugins.api import _make_tenant
from tests.plugins.worker import RunningWorker, start_worker

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.integration,
    pytest.mark.docker,
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.timeout(900),
]

TENANTS = 5
RUNS_PER_TENANT = 10
DECODE_TOKENS = 16
CELERY_CONCURRENCY = 5
#: The whole load must be through within this many seconds of the first submission.
DEADLINE_S = 600.0

LIP = f"""
from symphony import kv_create, pred, send_to_user, tokenize


def main(args):
    kv = kv_create()
    dist = pred(kv, tokenize("Load test prompt number " + str(args["n"])))[-1]
    out = []
    for _ in range({DECODE_TOKENS}):
        tok = dist.argmax()
        out.append(tok)
        send_to_user(str(tok) + " ")
        dist = pred(kv, [tok])[-1]   # one decode step, batched with the other runs
    return {{"tokens": out}}
""".encode()


@pytest.fixture
def stack_worker(tiny_model_dir: Path) -> Iterator[RunningWorker]:
    """A private worker: its sessions, pages and sockets are this test's alone to account for."""
    with start_worker(tiny_model_dir, name="load", num_pages=128) as worker:
        yield worker


@pytest.fixture
def stack_env() -> dict[str, str]:
    """Cold containers only, so "no container left" is exact (a warm pool keeps some on purpose)."""
    return {"SYMPHONY_SANDBOX_POOL_SIZE": "0"}


@pytest.fixture
def stack_concurrency() -> int:
    return CELERY_CONCURRENCY


def _token_times(events: redis.Redis, run_id: str) -> list[float]:
    """Arrival times (ms, from the Redis stream ids) of the run's streamed tokens."""
    return [int(eid.split(b"-")[0]) for eid, f in events.xrange(f"run:{run_id}") if f.get(b"type") == b"token"]


def test_fifty_concurrent_runs_from_five_tenants(stack, stack_worker, docker_client, tmp_path) -> None:
    from api.models import Plan, Run, UsageRecord
    from sandbox.spec import LABEL_RUN
    from symphony_client import Client

    Plan.objects.update_or_create(
        name="loadtest",
        defaults={"max_concurrent_runs": RUNS_PER_TENANT, "max_tokens_per_run": 4096, "max_run_seconds": 600},
    )
    baseline = stack_worker.admin.health()
    assert baseline["sessions"] == 0, baseline
    lip = tmp_path / "load.py"
    lip.write_bytes(LIP)

    tenants = []
    for i in range(TENANTS):
        t = _make_tenant(f"load{i}-{uuid.uuid4().hex[:4]}")
        t.tenant.plan = "loadtest"
        t.tenant.save(update_fields=["plan"])
        client = Client(stack, t.key_secret, timeout=60)
        tenants.append((t, client, client.upload_program(lip, name="load")["id"]))

    # Interleaved submission from 5 client threads, one per tenant, all at once.
    def submit(index: int) -> list[str]:
        _, client, program = tenants[index]
        return [
            client.create_run(program, args={"n": n}, limits={"deadline_s": 300})["id"] for n in range(RUNS_PER_TENANT)
        ]

    started = time.monotonic()
    with ThreadPoolExecutor(TENANTS) as pool:
        run_ids = dict(zip(range(TENANTS), pool.map(submit, range(TENANTS)), strict=True))
    all_ids = [rid for ids in run_ids.values() for rid in ids]
    assert len(set(all_ids)) == TENANTS * RUNS_PER_TENANT

    while time.monotonic() - started < DEADLINE_S:
        pending = Run.objects.filter(pk__in=all_ids).exclude(status__in=Run.TERMINAL).count()
        if pending == 0:
            break
        time.sleep(1.0)
    elapsed = time.monotonic() - started
    runs = {str(r.pk): r for r in Run.objects.filter(pk__in=all_ids)}
    statuses = defaultdict(int)
    for r in runs.values():
        statuses[r.status] += 1
    assert statuses == {"succeeded": len(all_ids)}, (
        f"after {elapsed:.0f}s: {dict(statuses)}; first error: "
        f"{next((r.error for r in runs.values() if r.status != 'succeeded'), None)}"
    )
    for r in runs.values():
        assert len(r.result["tokens"]) == DECODE_TOKENS, r.result

    # Billing: each tenant's decode tokens, exactly as generated (hence within 10% of fair).
    decode = {
        i: sum(UsageRecord.objects.filter(run_id__in=run_ids[i]).values_list("decode_tokens", flat=True))
        for i in range(TENANTS)
    }
    fair = sum(decode.values()) / TENANTS
    assert fair == RUNS_PER_TENANT * DECODE_TOKENS, decode
    for i, tokens in decode.items():
        assert abs(tokens - fair) <= 0.1 * fair, (i, decode)

    # Fairness while contended: from the moment every tenant has streamed a token until the
    # first tenant is done, count streamed tokens per tenant.
    events = redis.Redis.from_url(django_settings.REDIS_URL)
    times = {i: sorted(t for rid in run_ids[i] for t in _token_times(events, rid)) for i in range(TENANTS)}
    assert all(len(ts) == RUNS_PER_TENANT * DECODE_TOKENS for ts in times.values()), {
        i: len(ts) for i, ts in times.items()
    }
    lo = max(ts[0] for ts in times.values())
    hi = min(ts[-1] for ts in times.values())
    window = {i: sum(lo <= t <= hi for t in ts) for i, ts in times.items()}
    total = sum(window.values())
    print(f"\nload: {len(all_ids)} runs in {elapsed:.1f}s; contended window {hi - lo} ms, tokens {window}")
    assert total > 0, window
    for i, n in window.items():
        assert n >= 0.5 * total / TENANTS, f"tenant {i} starved while contended: {window}"

    # Nothing leaked. Containers of runs that ended at their result record are removed in the
    # background (pool slots and cold runs alike), so give the removals a bounded while.
    def leftovers() -> list[str]:
        return [name for rid in all_ids for name in container_names(docker_client, label=f"{LABEL_RUN}={rid}")]

    wait_for(lambda: not leftovers(), timeout=30, interval=0.5, message="every run's container to be removed")
    health = stack_worker.admin.health()
    assert health["sessions"] == 0, health
    assert health["pages_free"] == baseline["pages_free"], (baseline, health)
    assert stack_worker.admin.stats()["sessions"] == []
    sockets = list(Path(stack_worker.sessions_dir).glob("*.sock"))
    assert sockets == [], sockets
    stack_worker.assert_alive()
    assert elapsed < DEADLINE_S
    events.delete(*(f"run:{rid}" for rid in all_ids))
