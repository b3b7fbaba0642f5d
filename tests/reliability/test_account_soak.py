"""The combined hostile soak of the isolation issue: every attack at once from TWO tenants of ONE
account, while a third tenant (another account) runs four canaries throughout.

The attacker's account (one person owning both tenants) runs, all at the same time for
``ATTACK_S``: in each tenant a LIP with every attack of tests/reliability/test_hostile_soak.py
(big ``send_to_user`` messages, unread pipelined replies, idle session connections, pins, a
grammar bomb, tiny ``pred`` floods) plus forking a KV file until the account's device-page
ceiling, streaming toward the account's share of Redis (its plan lets each run stream more than
half of it), one ~3,800-token prefill after another (two at a time across the account), and
first-time grammar compiles; runs that only ``sleep`` to hold executor slots; replays of big
finished streams that are never read; and the HTTP attacks of the older soak (event streams,
run-creation races, a big upload, wrong keys under forged ``X-Forwarded-For``).

The canary tenant meanwhile repeats, one after the other: a REST run, a ``/v1`` chat call, a
``/v1`` call whose JSON schema was never compiled before, and a REST run that prefills 3,800
tokens. Each kind's median under attack must stay within ``CANARY_BOUND`` of its idle median,
and afterwards the stack is clean: no container, worker session, slot lease, executor
heartbeat or stream lease left, the device pages given back, connections within their pools.

The HTTP attacks' clients (event-stream floods, run-creation races, the big upload, forged
wrong keys, stalled replays) run in a child process at ``nice 19``
(tests/reliability/attack_clients.py): in production they are the attacker's own machine, not
the service, and in this process they took the shared cores from the stack, so the soak
measured the harness competing with itself. The canary's client stays at normal priority. The
attacker's LIPs are the service's work (they run in its sandboxes) and are not niced.

Why 2x and not 1.5x: this machine has two cores, shared by the engine, gVisor, uvicorn, Celery,
Redis, PostgreSQL and the grammar children. The attacker's account is *entitled* to its fair
share of the engine (half of every contended forward's prompt tokens, seats up to the canary's
width), and on a CPU engine that share is CPU the canary's sandbox start, its LIP and its web
request then wait for; no scheduler of ours can take CPU back from gVisor starting the canary's
sandbox, a cold start on every run here. A contended forward may also last up to twice a
decode-only one (``contended_step_ratio``), which the chat call's decode steps ride. The report
prints, per kind, the engine's part of the canary's time (its calls' seconds queued plus in
forwards, from the worker's stats) beside the whole, and the traces of the median chat and
prefill calls.

Where the time went, and what fixed it (each measured here):
(1) every sandboxed run waited for the spawn broker's 1 s poll at its end; the broker is woken
now. (2) The seat cap was per tenant, so the attacker's two tenants took 32 seats of every
forward; it is per account. (3) The attacker's grammar call, refused by the compile back-off,
was asked again at once, ~800 times a second (37,699 refusals in ~45 s): the worker's event loop
held the interpreter lock as often as the engine thread (py-spy), and the canary's decode
forwards took 11-15 ms against 5 ms idle. The worker now holds the replies of an account's
repeated refusals (gpu_worker/refusal_pacing.py, tests/reliability/test_refusal_flood.py).
(4) The contended step was sized from moving averages of the forward's costs, which swung with
the load (35-784 tokens within a minute): when it collapsed, the canary's 3,800-token prompt
took 293 forwards. It is sized from the fastest recent samples now (contention only adds time).

Before (3) and (4), no run held every kind within 2x (chat 1.9-4.0x, grammar 1.7-4.1x, prefill
1.9-3.8x over a dozen runs on two hosts). Tried then and not kept, one or two runs each: a
tighter contended step (ratio 1.5: chat better, prefill worse), the sandboxes' CPU weight cut to
an eighth (chat and grammar better, REST and prefill worse: the canary's own sandbox is a
sandbox too), the worker's GIL switch interval at 0.5 ms (faster forwards, the time moving to
the web process), the worker at nice -5, and one forward thread instead of two (bench/NOTES.md,
"Fewer forward threads"): none held every kind within 2x. After both, eight runs on a 2-core AMD EPYC host
(2026-11-29, load 1.4-3.3 idle and 2.6-5.5 under attack; medians of the idle calls and of
15-22 under attack): REST 1.21-1.41x of 0.5 s, chat 1.46-1.90x of 0.06-0.09 s, first-time
grammar 1.46-1.68x of 0.07-0.09 s, 3,800-token prefill 1.33-1.58x of 0.55 s. Chat stays nearest
the bound: its decode steps ride beside the attacker's prompt chunks (6.4 ms against 5.1 ms a
step), its prompt beside the attacker's share of the step. Hence ``CANARY_BOUND`` 2x, 1.5x
being what most runs meet.

Every other assertion held in every run: the account stopped at its device-page ceiling (ENOSPC
naming 120 of 160 pages, fair share 80), at its Redis share (EDQUOT at an equal share of the
stream memory between the accounts), its replays and streams got 429s, its prompts completed,
and the stack was clean afterwards.

Self-stopping and bounded: every loop checks the attack's deadline, every call has a timeout,
all traffic goes to 127.0.0.1 and the worker's Unix sockets.
"""

from __future__ import annotations

import json
import random
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
import requests
from django.conf import settings as django_settings
from django.utils.dateparse import parse_datetime

from tests.conftest import container_names, wait_for
from tests.plugins.api import ApiTenant
from tests.plugins.worker import RunningWorker, start_worker
from tests.reliability import attack_clients
from tests.reliability.test_hostile_soak import HOSTILE, Tenant

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.integration,
    pytest.mark.docker,
    pytest.mark.vllm,
    pytest.mark.timeout(900),
]

ATTACK_S = 60.0
#: A canary kind's median under attack may take this many times its idle median (see the
#: module docstring for why not 1.5x on this machine).
CANARY_BOUND = 2.0
#: Rounds of the four canaries measured before the attack.
IDLE_ROUNDS = 8
CELERY_CONCURRENCY = 4
PROMPT_TOKENS = 3800
NUM_PAGES = 161  # page 0 is the engine's: a pool of 160
#: Threads of tiny ``pred`` calls in each attacking run (two runs: twice this in all).
PRED_THREADS = 16
REPLAY_STALL_S = 3.0
#: Entries of the attacker's finished streams that its replays never read.
REPLAY_ENTRIES = 64
REPLAY_ENTRY_BYTES = 256 * 1024
MIB = 1024 * 1024
#: The leases and heartbeats a run holds in Redis only while it executes.
TRANSIENT_KEYS = ("symphony:executor-slots:*", "symphony:executor:*", "symphony:streams:*")

ACCOUNT_ATTACKS = b"""

_older_attacks = main


def main(args):
    import random as _random

    stop = time.monotonic() + args["seconds"]
    refused = {}
    done = {"prefills": 0, "grammars": 0, "most_forks": 0}
    lock = threading.Lock()

    def note(kind, exc):
        with lock:
            refused.setdefault(kind, f"{type(exc).__name__}: {exc}"[:400])

    def forks():
        # Each fork of a one-page file gets a 1,023-token prompt of its own: 8 new pages a call,
        # so the account reaches its device-page ceiling within the attack.
        rng = _random.Random(args["seed"] + 100)
        while time.monotonic() < stop:
            base = sy.kv_create()
            held = [base]
            try:
                sy.pred(base, [5] * 16)[-1].release()
                while time.monotonic() < stop:
                    child = base.fork()
                    held.append(child)
                    sy.pred(child, [rng.randrange(100, 4000) for _ in range(1023)])[-1].release()
            except SymphonyError as exc:
                note("forks", exc)
            with lock:
                done["most_forks"] = max(done["most_forks"], len(held))
            time.sleep(2.0)  # hold the account's ceiling a while, then take it again
            for kv in held:
                try:
                    kv.close()
                except SymphonyError:
                    pass

    def prefills():
        rng = _random.Random(args["seed"])
        while time.monotonic() < stop:
            kv = sy.kv_create()
            try:
                sy.pred(kv, [rng.randrange(100, 4000) for _ in range(args["prompt_tokens"])])[-1].release()
                with lock:
                    done["prefills"] += 1
            except SymphonyError as exc:
                note("prefills", exc)
                time.sleep(0.2)
            finally:
                kv.close()

    def grammars():
        # Nested bounded repetitions within the pre-compile budget (256 copies) that compile
        # for longer than the compile time budget; a character class of their own each time,
        # so every one is a first-time compile.
        bounds = ((16, 16), (15, 17), (17, 15), (12, 20), (20, 12), (14, 18), (18, 14), (13, 19))
        i = 0
        while time.monotonic() < stop:
            i += 1
            chars = "a-%s0-%d" % ("mnopqrstuvwxyz"[(i + args["seed"] * 7) % 14], i % 10)
            props = {
                f"s{args['seed']}_{i}_{j}": {"type": "string", "pattern": "^([%s]{1,%d}){1,%d}$" % (chars, a, b)}
                for j, (a, b) in enumerate(bounds)
            }
            try:
                sy.grammar(json_schema={"type": "object", "properties": props, "required": list(props)})
                with lock:
                    done["grammars"] += 1
            except SymphonyError as exc:
                note("grammars", exc)

    threads = [threading.Thread(target=fn, daemon=True) for fn in (forks, prefills, grammars)]
    for t in threads:
        t.start()
    older = _older_attacks(args)
    for t in threads:
        t.join(max(0.1, stop - time.monotonic() + 10))
    return {"refused": {**older["refused"], **refused}, "done": done}
"""

SLEEPER = b"""
from symphony import send_to_user, sleep


def main(args):
    send_to_user("started")
    sleep(args["seconds"])
    return {"slept": args["seconds"]}
"""

CANARY = b"""
import random

import symphony as sy


def main(args):
    if "prompt_tokens" not in args:
        kv = sy.kv_create()
        out = sy.generate(kv, sy.tokenize("The canary sings a short song about the sea"), max_tokens=24)
        return {"tokens": out}
    rng = random.Random(args["seed"])
    kv = sy.kv_create()
    dist = sy.pred(kv, [rng.randrange(100, 4000) for _ in range(args["prompt_tokens"])])[-1]
    token = dist.argmax()
    dist.release()
    return {"prompt": sy.kv_len(kv), "token": token}
"""


@pytest.fixture
def stack_worker(tiny_model_dir: Path) -> Iterator[RunningWorker]:
    """Room for the long prompts: a 4,096-token context, and a pool (128-token pages) whose
    reserve (a quarter: 40 pages) holds the canary's 3,800-token prompt (30 pages) while the
    attacker holds its ceiling (120: its two prompts and a few forks)."""
    extra = ["--max-model-len", "4096"]
    with start_worker(tiny_model_dir, name=f"asoak{uuid.uuid4().hex[:4]}", num_pages=NUM_PAGES, extra_args=extra) as w:
        yield w


@pytest.fixture
def stack_env() -> dict[str, str]:
    return {"SYMPHONY_SANDBOX_POOL_SIZE": "0", "SYMPHONY_REPLAY_STALL_S": str(REPLAY_STALL_S)}


@pytest.fixture
def stack_concurrency() -> int:
    return CELERY_CONCURRENCY


def _second_tenant(owner: ApiTenant, slug: str) -> ApiTenant:
    """Another tenant of ``owner``'s person: the same account."""
    from api.models import Membership
    from api.models import Tenant as TenantRow
    from api.services.keys import issue_key
    from api.tenancy import KEY_SCOPES

    owner.tenant.account = owner.user
    owner.tenant.save(update_fields=["account"])
    tenant = TenantRow.objects.create(name=slug.title(), slug=slug, account=owner.user)
    Membership.objects.create(user=owner.user, tenant=tenant, role="owner")
    return ApiTenant(tenant, owner.user, issue_key(tenant, "test", list(KEY_SCOPES), owner.user).secret)


def _plan(tenants: list[ApiTenant], name: str, **limits: object) -> None:
    from api.models import Plan

    Plan.objects.update_or_create(name=name, defaults=limits)
    for t in tenants:
        t.tenant.plan = name
        t.tenant.save(update_fields=["plan"])


def _finished_stream(tenant: ApiTenant) -> str:
    """A finished run of ``tenant`` whose stream is far bigger than a replay slot."""
    from api.models import Program, Run
    from api.services import programs

    program = Program.objects.create(tenant=tenant.tenant, name=f"big-{uuid.uuid4().hex[:4]}")
    version = programs.add_version(program, "p.py", b"def main(a):\n    return 1\n")
    run = Run.objects.create(tenant=tenant.tenant, program_version=version, args={}, limits={}, status="succeeded")
    client = redis.Redis.from_url(django_settings.REDIS_URL)
    chunk = '{"text": "' + "x" * (REPLAY_ENTRY_BYTES - 12) + '"}'
    pipe = client.pipeline(transaction=False)
    for _ in range(REPLAY_ENTRIES):
        pipe.xadd(f"run:{run.pk}", {"type": "token", "data": chunk})
    pipe.xadd(f"run:{run.pk}", {"type": "end", "data": '{"status": "succeeded"}'})
    pipe.execute()
    return str(run.pk)


class Canaries:
    """The canary tenant's four kinds of call, each timed from the client's side."""

    def __init__(self, base_url: str, tenant: Tenant, worker: RunningWorker) -> None:
        self.base_url, self.tenant, self.worker = base_url, tenant, worker
        self.rng = random.Random(11)
        #: Queued -> started of each of its runs, for the report.
        self.queued: list[float] = []
        #: Per kind, the seconds each call's ``pred`` calls spent in the worker (queued plus in
        #: forwards, the scheduler's ``pred_s_per_tenant``): the engine's part of its time.
        self.engine: dict[str, list[float]] = {}
        #: Per kind traced in the report (chat, prefill): (seconds, run id) of each call.
        self.runs: dict[str, list[tuple[float, str]]] = {"chat": [], "prefill": []}

    def _run(self, args: dict) -> tuple[float, dict]:
        """Queued to finished, by the server's clock (the client's polling adds no noise)."""
        r = self.tenant.start(args, deadline_s=120)
        assert r.status_code == 201, r.text
        run = self.tenant.wait(r.json()["id"], timeout=120)
        assert run["status"] == "succeeded", run
        created = parse_datetime(run["created_at"])
        elapsed = (parse_datetime(run["finished_at"]) - created).total_seconds()
        self.queued.append(round((parse_datetime(run["started_at"]) - created).total_seconds(), 2))
        return elapsed, run

    def rest(self) -> float:
        elapsed, run = self._run({})
        assert len(run["result"]["tokens"]) == 24, run["result"]
        return elapsed

    def prefill(self) -> float:
        elapsed, run = self._run({"prompt_tokens": PROMPT_TOKENS, "seed": self.rng.randrange(1 << 30)})
        assert run["result"]["prompt"] == PROMPT_TOKENS, run["result"]
        self.runs["prefill"].append((elapsed, run["id"]))
        return elapsed

    def _chat(self, extra: dict) -> tuple[float, str]:
        """The call's seconds and the id of the run that answered it."""
        body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "Say hi."}], **extra}
        started = time.perf_counter()
        r = requests.post(f"{self.base_url}/v1/chat/completions", headers=self.tenant.headers, json=body, timeout=120)
        elapsed = time.perf_counter() - started
        assert r.status_code == 200, r.text[:500]
        assert r.json()["choices"][0]["message"]["role"] == "assistant", r.text[:500]
        return elapsed, r.headers["X-Symphony-Run-Id"]

    def chat(self) -> float:
        elapsed, run_id = self._chat({"temperature": 0})
        self.runs["chat"].append((elapsed, run_id))
        return elapsed

    def median_traces(self) -> dict[str, str]:
        """Per traced kind, where its median call's time went, from its run's trace (the
        product's own); the calls are forgotten after."""
        out = {}
        for kind, runs in self.runs.items():
            elapsed, run_id = sorted(runs)[len(runs) // 2]
            r = requests.get(f"{self.base_url}/api/v1/runs/{run_id}/trace", headers=self.tenant.headers, timeout=30)
            out[kind] = f"{elapsed:.3f} s: {_where_the_time_went(r.json())}"
            runs.clear()
        return out

    def grammar(self) -> float:
        """A JSON schema never compiled before: property names no one used."""
        fresh = f"k{uuid.uuid4().hex[:10]}"
        schema = {"type": "object", "properties": {fresh: {"type": "integer"}}, "required": [fresh]}
        fmt = {"type": "json_schema", "json_schema": {"name": "c", "schema": schema}}
        return self._chat({"response_format": fmt})[0]

    def kinds(self) -> dict[str, Callable[[], float]]:
        return {"rest": self.rest, "chat": self.chat, "grammar": self.grammar, "prefill": self.prefill}

    def _engine_s(self) -> float:
        return self.worker.admin.stats()["scheduler"]["pred_s_per_tenant"].get(self.tenant.record.tenant.slug, 0.0)

    def round(self, into: dict[str, list[float]]) -> None:
        for kind, call in self.kinds().items():
            before = self._engine_s()
            into.setdefault(kind, []).append(call())
            self.engine.setdefault(kind, []).append(self._engine_s() - before)


def _where_the_time_went(trace: dict) -> str:
    """A run's trace in one line: the run, its queueing, and each ``pred`` with its forwards'
    time, its wait for a forward and the batch it rode in."""
    spans = trace.get("spans") or []
    run = next((sp["duration_s"] for sp in spans if sp.get("parent") is None), 0.0)
    queued = sum(sp["duration_s"] for sp in spans if sp["name"] == "queued")
    parts = [f"run {run:.3f} s, queued {queued:.3f} s"]
    for sp in spans:
        a = sp["attrs"]
        if sp["name"] == "pred":
            parts.append(
                f"pred {sp['duration_s']:.3f} s ({a.get('forwards')} forwards {a.get('forward_s', 0):.3f} s, "
                f"waited {a.get('queue_wait_s', 0):.3f} s, batch {a.get('batch_size')} of "
                f"{a.get('batch_tokens')} tokens)"
            )
    return "; ".join(parts)


def _transient_keys() -> list[bytes]:
    client = redis.Redis.from_url(django_settings.REDIS_URL)
    return [k for pattern in TRANSIENT_KEYS for k in client.scan_iter(match=pattern)]


def _load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def test_two_tenants_of_one_account_attacking_at_once_leave_a_third_tenants_canaries_within_bound(
    stack, stack_worker, api_tenant_a, api_tenant_b, docker_client
) -> None:
    from api.models import Run
    from gpu_worker.resource_model import Pool, PoolName
    from sandbox.spec import LABEL_RUN

    base_url = stack
    first, second = api_tenant_a, _second_tenant(api_tenant_a, "alpha-two")
    account = first.tenant.account_key
    assert second.tenant.account_key == account != api_tenant_b.tenant.account_key
    # The attacker's plan lets each run stream 200 MiB and take every device page it can, so the
    # account-wide shares (not the per-run limits) are what stop it.
    _plan(
        [first, second],
        "soak-attacker",
        max_concurrent_runs=5,
        max_tokens_per_run=5_000_000,
        max_run_seconds=300,
        max_device_pages_per_run=None,
        stream_bytes_per_run=200 * MIB,
        api_requests_per_minute=600,
    )
    _plan([api_tenant_b], "soak-canary", max_concurrent_runs=2, max_tokens_per_run=20_000, max_run_seconds=120)
    attack_program = HOSTILE + ACCOUNT_ATTACKS
    hostile = [
        Tenant(base_url, "", attack_program, record=first),
        Tenant(base_url, "", attack_program, record=second),
    ]
    sleepers = [Tenant(base_url, "", SLEEPER, first, "sleeper"), Tenant(base_url, "", SLEEPER, second, "sleeper")]
    canary = Canaries(base_url, Tenant(base_url, "", CANARY, record=api_tenant_b), stack_worker)
    replayed = [(first, _finished_stream(first)), (second, _finished_stream(second))]
    health = stack_worker.admin.health()
    pool = Pool(PoolName.DEVICE_KV_PAGES, health["pages_total"])

    # Idle: one warm-up round (first sandbox, first prefill of each shape), then medians of
    # IDLE_ROUNDS: the idle median is every ratio's denominator, so it gets as many calls as fit.
    canary.round({})
    canary.engine = {}
    canary.runs = {kind: [] for kind in canary.runs}
    idle: dict[str, list[float]] = {}
    for _ in range(IDLE_ROUNDS):
        canary.round(idle)
    idle_load = _load()
    idle_queued, canary.queued = canary.queued, []
    idle_engine, canary.engine = canary.engine, {}
    idle_traces = canary.median_traces()

    # The attack: both tenants' LIPs first (they take two of the account's three slots), then
    # the sleepers (one more slot, one queued behind the account's bound), then HTTP.
    attacks = []
    for i, tenant in enumerate(hostile):
        args = {"seconds": ATTACK_S, "pred_threads": PRED_THREADS, "seed": i + 1, "prompt_tokens": PROMPT_TOKENS}
        r = tenant.start(args, deadline_s=ATTACK_S + 90)
        assert r.status_code == 201, r.text
        attacks.append(r.json()["id"])
    stop = time.monotonic() + ATTACK_S
    sleeper_ids = []
    for tenant in sleepers:
        r = tenant.start({"seconds": ATTACK_S / 2}, deadline_s=ATTACK_S + 90)
        assert r.status_code == 201, r.text
        sleeper_ids.append(r.json()["id"])
    # The HTTP attacks' clients in a process of their own at nice 19: they are the attacker's
    # machine, not the service (tests/reliability/attack_clients.py).
    clients = attack_clients.start_niced(
        {
            "seconds": stop - time.monotonic(),
            "base_url": base_url,
            "http": {"key_secret": first.key_secret, "program": sleepers[0].program, "run_id": sleeper_ids[0]},
            "replays": {"owners": [[t.key_secret, run_id] for t, run_id in replayed], "stall_s": REPLAY_STALL_S},
        }
    )
    ledger = redis.Redis.from_url(django_settings.REDIS_URL)
    most_stream_bytes = 0
    time.sleep(3)  # the attacks are under way
    under: dict[str, list[float]] = {}
    while time.monotonic() < stop - 4:
        canary.round(under)
        held = ledger.hget("symphony:stream-bytes:accounts", account)
        most_stream_bytes = max(most_stream_bytes, int(held or 0))
    attack_load = _load()
    box = attack_clients.result(clients, timeout=120)
    results = [tenant.wait(run_id, timeout=240) for tenant, run_id in zip(hostile, attacks, strict=True)]

    ratios = {kind: statistics.median(under[kind]) / statistics.median(idle[kind]) for kind in idle}
    print(
        f"\naccount soak (load idle {idle_load}, under attack {attack_load}):"
        + "".join(
            f"\n  {kind}: idle {[round(t, 2) for t in idle[kind]]} under attack "
            f"{[round(t, 2) for t in under.get(kind, [])]} -> {ratios[kind]:.2f}x (bound {CANARY_BOUND}x); "
            f"in the engine: idle {statistics.median(idle_engine[kind]):.3f} s, under attack "
            f"{statistics.median(canary.engine.get(kind) or [0.0]):.3f} s (medians)"
            for kind in idle
        )
        + f"\n  attacker runs: {[r['status'] for r in results]}; "
        f"{json.dumps([(r.get('result') or {}).get('done') for r in results])}"
        f"\n  refused: {json.dumps([(r.get('result') or {}).get('refused') for r in results])[:3000]}"
        f"\n  account's stream bytes at most {most_stream_bytes >> 20} MiB; "
        f"http: { {k: sorted(set(v)) for k, v in box.get('http', {}).items()} }; "
        f"replays: {sorted(set(box.get('replays', [])))}"
        f"\n  canary runs queued -> started (s): idle {idle_queued}, under attack {canary.queued}"
        + "".join(
            f"\n  median {kind} call idle {idle_traces[kind]}\n  median {kind} call under attack {trace}"
            for kind, trace in canary.median_traces().items()
        )
    )
    assert all(under.get(kind) for kind in idle), under
    slow = {kind: round(ratio, 2) for kind, ratio in ratios.items() if ratio > CANARY_BOUND}

    # The attacks happened, and met the account-wide bounds, not the per-run ones.
    refused: dict[str, str] = {}
    for result in results:
        refused.update((result.get("result") or {}).get("refused") or {})
    done = [(result.get("result") or {}).get("done") or {} for result in results]
    assert sum(d.get("prefills", 0) for d in done) >= 2, done
    at_ceiling = [refused.get(kind, "") for kind in ("forks", "prefills")]
    assert any("this account holds" in why for why in at_ceiling), refused
    assert max(d.get("most_forks", 0) for d in done) <= pool.ceiling, (done, pool)
    assert "send_to_user" in refused, refused
    assert 0 < most_stream_bytes, most_stream_bytes
    assert 429 in box["http"]["streams"], box["http"]
    assert all(c in (200, 429) for c in box["replays"]) and 200 in box["replays"], box["replays"]

    # Clean afterwards.
    assert requests.get(f"{base_url}/api/v1/health", timeout=10).json()["status"] == "ok"
    runs = Run.objects.filter(tenant__in=[first.tenant, second.tenant, api_tenant_b.tenant])
    wait_for(
        lambda: not runs.exclude(status__in=Run.TERMINAL).exists(),
        timeout=ATTACK_S + 120,
        interval=1,
        message="every run of the soak to end",
    )
    run_ids = [str(pk) for pk in runs.values_list("pk", flat=True)]
    wait_for(
        lambda: not [n for rid in run_ids for n in container_names(docker_client, label=f"{LABEL_RUN}={rid}")],
        timeout=60,
        interval=0.5,
        message="every run's sandbox container removed",
    )
    wait_for(lambda: not _transient_keys(), timeout=30, interval=0.5, message="slot leases and heartbeats gone")
    assert stack_worker.admin.health()["sessions"] == 0
    assert not list(Path(stack_worker.sessions_dir).glob("*.sock"))
    for owner in (first, second, api_tenant_b):
        for f in stack_worker.admin.kv_list(owner.tenant.slug):
            stack_worker.admin.kv_delete(owner.tenant.slug, f["name"])
    assert stack_worker.admin.health()["pages_free"] == health["pages_free"]
    ledger.delete(*[f"run:{rid}" for rid in run_ids])
    stack_worker.assert_alive()
    # Last, so a run that misses a bound has still checked everything above.
    assert not slow, f"canaries past {CANARY_BOUND}x their idle median: {slow}"
