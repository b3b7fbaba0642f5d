"""B9 — SWARM: a coordinator and its agents as a run tree sharing one context, vs a client loop
over ``vllm serve``.

Workload, per team: a ``context_tokens`` shared context; ``agents`` agents; ``rounds`` rounds in
which the coordinator sends every agent a ``message_tokens`` message and each agent replies
with exactly ``reply_tokens`` greedy tokens (EOS ignored); an agent's history (the context, its
messages, its replies) carries over to its next round. ``teams`` teams a repetition,
``in_flight`` at a time. All token ids come from fixed seeds, fresh for each repetition and
team (no side starts a repetition with a cache the last one filled).

* **Symphony**: the whole control plane (uvicorn on ``DATABASE_URL``'s database, a Celery
  executor with a thread per team in flight and a warm gVisor pool of ``warm_pool`` containers,
  the worker). A team is one run of ``bench/b9_team.py``: the coordinator prefills the context
  into a named KV file and ``spawn``s one child run per agent (each in its own sandbox); agents
  open the file read-only and fork it (the context is computed once per team), and the team
  talks over the run tree's channels. The client creates the run and follows its event stream
  to its end. The benchmark's tenant is on a plan of its own (:data:`PLAN`) that admits
  ``in_flight`` trees of ``agents + 1`` runs at once; no other plan is changed.
* **Baseline**: ``vllm serve`` with prefix caching (same model, dtype, KV blocks, max batch and
  length, ``--enable-prompt-tokens-details``); one client thread per team doing the same rounds,
  a round's ``agents`` calls at once, each ``/v1/completions`` re-sending context + that agent's
  history + its message. The prefix cache serves the full 128-token blocks it holds; the rest
  is recomputed (and a round's first calls miss the context entirely: none of them is cached
  until one has been computed).

Figures: teams/s (the ratio) and tokens computed per team on each side: Symphony's from the
usage of the team's runs (prefill + decode), vLLM's from ``prompt_tokens - cached_tokens`` of
every reply plus its decode steps. How often both sides' greedy replies agree is a note.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import socket
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from bench.baseline_server import Completion, VLLMServer
from bench.control_plane import Processes, control_plane_env, database_ready
from bench.harness import (
    ROOT,
    BenchConfig,
    BenchResult,
    Comparison,
    WorkerOptions,
    WorkerProcess,
    baseline_blocks,
    config_dict,
    fill_sides,
    max_len_for,
    random_tokens,
    repetition_starts,
    run_threads,
    share_out,
    stopwatch,
    workload_args,
)

NAME = "b9_swarm"
#: The benchmark tenant's plan (created or updated by the benchmark, used by its tenants only).
PLAN = "bench-b9"
#: Target: teams/s over the client loop.
TARGET = 1.55
#: Seconds a team may take (its run's deadline) and a wait for the warm pool.
TEAM_DEADLINE_S = 900
POOL_FILL_S = 300.0
BLOCK = 128


@dataclass(frozen=True)
class Workload:
    """Sizes of one B9 run (defaults: the spec's team)."""

    teams: int = 8
    in_flight: int = 4
    agents: int = 6
    rounds: int = 4
    context_tokens: int = 1500
    message_tokens: int = 40
    reply_tokens: int = 32
    #: Warm gVisor containers the executor keeps (0: every run starts a cold one). The default
    #: is one wave's runs; each repetition starts once the pool is full again.
    warm_pool: int = 28

    def history_tokens(self) -> int:
        return self.rounds * (self.message_tokens + self.reply_tokens)

    def longest(self) -> int:
        """An agent's longest sequence: the context and its whole history."""
        return self.context_tokens + self.history_tokens()

    def pages(self) -> int:
        """Device pages = vLLM blocks: per team in flight the context once, and per agent its
        history plus a copied partial page and one being filled; plus page 0."""
        ctx = -(-self.context_tokens // BLOCK)
        history = -(-self.history_tokens() // BLOCK)
        return 1 + self.in_flight * (ctx + self.agents * (history + 2))


QUICK = Workload(
    teams=2,
    in_flight=2,
    agents=2,
    rounds=2,
    context_tokens=64,
    message_tokens=8,
    reply_tokens=4,
    warm_pool=0,
)


@dataclass(frozen=True)
class Team:
    """One team's token ids: the context and per round one message per agent."""

    context: list[int]
    messages: list[list[list[int]]]


def teams_for(wl: Workload, seed: int, rep: int) -> list[Team]:
    return [
        Team(
            context=random_tokens(wl.context_tokens, seed, 90, rep, t),
            messages=[
                [random_tokens(wl.message_tokens, seed, 91, rep, t, r, a) for a in range(wl.agents)]
                for r in range(wl.rounds)
            ],
        )
        for t in range(wl.teams)
    ]


@dataclass
class Outcome:
    """One side's pass over a repetition's teams: replies per team, and the token work."""

    replies: list[list[list[list[int]]]] = field(default_factory=list)
    computed_tokens: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    #: Symphony: runs per team (coordinator + agents); vLLM: prompt tokens the client sent.
    detail: list[int] = field(default_factory=list)


# ---------------------------------------------------------------------------- Symphony
@dataclass(frozen=True)
class Stack:
    """The control plane as the benchmark's client sees it."""

    url: str
    key: str
    program: int
    celery_pid: int

    def client(self) -> Any:
        return client_sdk()(self.url, self.key, timeout=120)


def client_sdk() -> Any:
    """``symphony_client.Client``: the client SDK lives in client/, which the benchmark's
    environment does not install (tests put it on the path the same way)."""
    path = str(ROOT / "client")
    if path not in sys.path:
        sys.path.append(path)
    from symphony_client import Client

    return Client


def symphony_side(stack: Stack, wl: Workload, teams: list[Team], warm: int) -> tuple[float, Outcome]:
    """(teams/s, outcome): one run tree per team, ``in_flight`` at a time; the clock stops when
    the last team's event stream has ended."""
    wait_for_pool(stack.celery_pid, warm)

    def one(_: int, team: Team) -> str:
        client = stack.client()
        args = {
            "file": f"b9-{uuid.uuid4().hex[:12]}",
            "context": team.context,
            "messages": team.messages,
            "reply_tokens": wl.reply_tokens,
        }
        run = client.create_run(stack.program, args=args, limits={"deadline_s": TEAM_DEADLINE_S})
        for _event in client.events(run["id"]):
            pass
        client.close()
        return str(run["id"])

    with stopwatch() as t:
        run_ids = share_out(teams, wl.in_flight, one)
    out = Outcome()
    client = stack.client()
    for run_id in run_ids:
        final = client.get_run(run_id)
        if final["status"] != "succeeded":
            raise RuntimeError(f"team run {run_id} {final['status']}: {final.get('error')}")
        out.replies.append(final["result"]["replies"])
        tree = [run_id, *(c["id"] for c in final["children"])]
        if len(tree) != wl.agents + 1:
            raise RuntimeError(f"team run {run_id} has {len(tree) - 1} children, not {wl.agents}")
        out.detail.append(len(tree))
        for rid in tree:
            usage = _usage(client, rid)
            out.prefill_tokens += int(usage["prefill_tokens"])
            out.decode_tokens += int(usage["decode_tokens"])
    client.close()
    out.computed_tokens = out.prefill_tokens + out.decode_tokens
    return len(teams) / t[0], out


def _usage(client: Any, run_id: str, timeout_s: float = 60.0) -> dict[str, Any]:
    """The run's recorded usage (written as its executor records the outcome, just after the end
    event a parent's stream carries, so it may lag a moment)."""
    deadline = time.monotonic() + timeout_s
    while True:
        usage = client.get_run(run_id)["usage"]
        if usage is not None:
            return dict(usage)
        if time.monotonic() > deadline:
            raise RuntimeError(f"run {run_id}: no usage recorded after {timeout_s}s")
        time.sleep(0.2)


def wait_for_pool(celery_pid: int, size: int) -> None:
    """Block until the executor's warm pool holds ``size`` idle containers: a repetition starts
    from a full pool (its refill after the last one is not timed against either side)."""
    if size <= 0:
        return
    import docker

    from sandbox.spec import LABEL_OWNER, LABEL_POOL

    owner = f"{socket.gethostname()}:{celery_pid}"
    client = docker.from_env()
    filters = {"label": [f"{LABEL_POOL}=1", f"{LABEL_OWNER}={owner}"], "status": "running"}
    deadline = time.monotonic() + POOL_FILL_S
    try:
        while len(client.containers.list(sparse=True, filters=filters)) < size:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the warm pool did not reach {size} containers in {POOL_FILL_S}s")
            time.sleep(0.5)
    finally:
        client.close()


# ---------------------------------------------------------------------------- baseline
@dataclass
class _Tally:
    prefill: int = 0
    decode: int = 0
    sent: int = 0

    def add(self, prompt: list[int], c: Completion) -> None:
        if c.cached_tokens < 0:
            raise RuntimeError("vllm serve did not report cached prompt tokens")
        self.prefill += c.prompt_tokens - c.cached_tokens
        self.decode += len(c.ids) - 1  # the first generated token comes out of the prefill
        self.sent += len(prompt)


def serve_team(server: VLLMServer, wl: Workload, team: Team) -> tuple[list[list[list[int]]], _Tally]:
    """One team as a client loop: each agent call re-sends the context and its history."""
    clients = [server.client() for _ in range(wl.agents)]
    histories: list[list[int]] = [[] for _ in range(wl.agents)]
    tally = _Tally()
    log: list[list[list[int]]] = []
    try:
        for messages in team.messages:
            prompts = [team.context + histories[a] + messages[a] for a in range(wl.agents)]
            pairs = zip(clients, prompts, strict=True)
            calls = [functools.partial(c.completion, p, wl.reply_tokens) for c, p in pairs]
            outs: list[Completion] = run_threads(calls)
            for a, (prompt, out) in enumerate(zip(prompts, outs, strict=True)):
                tally.add(prompt, out)
                histories[a] += messages[a] + out.ids
            log.append([out.ids for out in outs])
    finally:
        for client in clients:
            client.close()
    return log, tally


def serve_side(server: VLLMServer, wl: Workload, teams: list[Team]) -> tuple[float, Outcome]:
    with stopwatch() as t:
        done = share_out(teams, wl.in_flight, lambda _, team: serve_team(server, wl, team))
    out = Outcome()
    for log, tally in done:
        out.replies.append(log)
        out.prefill_tokens += tally.prefill
        out.decode_tokens += tally.decode
        out.detail.append(tally.sent)
    out.computed_tokens = out.prefill_tokens + out.decode_tokens
    return len(teams) / t[0], out


def agreement(a: Outcome, b: Outcome) -> float:
    """Share of (team, round, agent) replies identical on both sides."""
    pairs = [
        (x, y)
        for ta, tb in zip(a.replies, b.replies, strict=True)
        for ra, rb in zip(ta, tb, strict=True)
        for x, y in zip(ra, rb, strict=True)
    ]
    return sum(x == y for x, y in pairs) / len(pairs) if pairs else 1.0


# ------------------------------------------------------------------------------ stack
def _tenant_key(wl: Workload) -> str:
    """A fresh tenant on :data:`PLAN` and an API key of it (plaintext). The plan admits the
    benchmark's trees (``in_flight`` x (agents + 1) runs at once, ``agents`` children a run,
    one level) and has no request or token quota that would queue the benchmark's own calls."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "web.settings")
    import django

    django.setup()
    from django.contrib.auth import get_user_model

    from api.models import Membership, Plan, Tenant
    from api.services.keys import issue_key
    from api.tenancy import KEY_SCOPES

    limits = {
        "max_concurrent_runs": 2 * wl.in_flight * (wl.agents + 1),
        "max_children_per_run": max(8, wl.agents),
        "max_spawn_depth": 1,
        "max_tokens_per_run": 32768,
        "max_run_seconds": TEAM_DEADLINE_S,
        "tokens_per_month": None,
        "api_requests_per_minute": None,
        "max_concurrent_streams": 256,
        "max_device_pages_per_run": None,
        "max_kv_files": None,
        "kv_pinned_device_share": None,  # each team pins its context (bench/b9_team.py)
    }
    Plan.objects.update_or_create(name=PLAN, defaults=limits)
    slug = f"b9-{uuid.uuid4().hex[:8]}"
    tenant = Tenant.objects.create(name=slug, slug=slug, plan=PLAN)
    user = get_user_model().objects.create_user(username=f"{slug}@example.com", email=f"{slug}@example.com")
    Membership.objects.create(user=user, tenant=tenant, role="owner")
    return issue_key(tenant, "b9", list(KEY_SCOPES), user).secret


@contextlib.contextmanager
def control_plane(worker: WorkerProcess, wl: Workload) -> Iterator[Stack]:
    """uvicorn + a Celery executor (a thread per team in flight, a warm pool) on the worker;
    the team program uploaded for a fresh tenant."""
    from sandbox.image import ensure

    database_ready()
    key = _tenant_key(wl)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # Django's logging config: one line a request
    image = ensure(log=lambda m: None)
    common = {
        "SYMPHONY_WORKER_NAME": "bench",
        "SYMPHONY_WORKER_ADMIN_SOCKET": worker.admin_socket,
        "SYMPHONY_SESSIONS_DIR": str(worker.base / "s"),
        "SYMPHONY_ROUTING": "static",
        "SYMPHONY_SANDBOX_IMAGE": image,
    }
    procs = Processes()
    try:
        executor = control_plane_env(**common, SYMPHONY_SANDBOX_POOL_SIZE=str(wl.warm_pool))
        celery = [sys.executable, "-m", "celery", "-A", "web", "worker", "-Q", "worker.bench"]
        celery += ["--pool", "threads", "--concurrency", str(wl.in_flight), "--loglevel", "WARNING"]
        proc = procs.start("celery", [*celery, "--without-gossip", "--without-mingle"], executor)
        url = procs.web("web", control_plane_env(**common))
        client = client_sdk()(url, key, timeout=120)
        program = client.upload_program(ROOT / "bench" / "b9_team.py", name="b9-team")
        client.close()
        try:
            yield Stack(url, key, int(program["id"]), proc.pid)
        except Exception:
            for name, _, _ in procs.procs:
                print(f"--- {name} log tail:\n{procs.tail(name)}", file=sys.stderr)
            raise
    finally:
        procs.close()


# ------------------------------------------------------------------------------- run
def run(stack: Stack, server: VLLMServer, cfg: BenchConfig, wl: Workload, result: BenchResult) -> None:
    """Interleaved repetitions (S, B, then B, S), each on fresh teams, after one untimed team a
    side (both sides' first requests are slower: imports, first forwards, a cold pool)."""
    title = f"swarm {wl.agents} agents x {wl.rounds} rounds, {wl.in_flight} teams in flight"
    rate = Comparison(f"{title} vs vllm serve", "teams/s")
    prefill = Comparison("tokens prefilled per team", "tok", higher_is_better=False)
    computed = Comparison("tokens computed per team", "tok", higher_is_better=False)
    agree: list[float] = []
    sent: list[float] = []
    warm = teams_for(replace(wl, teams=1), cfg.seed, 1_000)
    symphony_side(stack, wl, warm, 0)  # the executor starts its pool on its first run
    serve_side(server, wl, warm)
    print(f"  b9: warmed up both sides ({time.strftime('%H:%M:%S')})", flush=True)
    for i in range(cfg.reps):
        repetition_starts()
        teams = teams_for(wl, cfg.seed, i)
        outcomes: dict[str, Outcome] = {}
        sides: list[tuple[str, Callable[[], tuple[float, Outcome]]]] = [
            ("symphony", functools.partial(symphony_side, stack, wl, teams, wl.warm_pool)),
            ("baseline", functools.partial(serve_side, server, wl, teams)),
        ]
        for key, fn in sides if i % 2 == 0 else list(reversed(sides)):
            r, outcomes[key] = fn()
            (rate.symphony if key == "symphony" else rate.baseline).add(r)
            print(f"  b9: rep {i} {key} {r:.4f} teams/s ({time.strftime('%H:%M:%S')})", flush=True)
        for side in ("symphony", "baseline"):
            getattr(prefill, side).add(outcomes[side].prefill_tokens / wl.teams)
            getattr(computed, side).add(outcomes[side].computed_tokens / wl.teams)
        agree.append(agreement(outcomes["symphony"], outcomes["baseline"]))
        sent.append(sum(outcomes["baseline"].detail) / wl.teams)
    rate.extra.update(
        target=f">= {TARGET}x teams/s vs a client loop over vllm serve",
        baseline_kind="vllm serve (prefix caching), one client loop per team re-sending context + history",
        same_replies=agree,
        baseline_prompt_tokens_sent_per_team=sent,
        runs_per_team=wl.agents + 1,
        warm_pool=wl.warm_pool,
    )
    prefill.extra["note"] = computed.extra["note"] = "work, not speed: lower is less"
    result.comparisons += [rate, prefill, computed]
    result.notes.append(
        f"tokens computed per team: Symphony {computed.symphony.median:.0f} (prefilled {prefill.symphony.median:.0f}), "
        f"vLLM {computed.baseline.median:.0f} (prefilled {prefill.baseline.median:.0f} of the "
        f"{statistics.median(sent):.0f} prompt tokens the client sent)"
    )
    result.notes.append(
        f"identical greedy replies on both sides: {100 * min(agree):.0f}%-{100 * max(agree):.0f}% of "
        "(team, round, agent) (lengths are fixed, so the token counts do not depend on it)"
    )
    result.notes.append(
        f"Symphony: {wl.agents + 1} runs (a sandbox each, warm pool of {wl.warm_pool}) per team, "
        f"on plan {PLAN} (created by the benchmark for its own tenant)"
    )


def main(argv: list[str] | None = None) -> int:
    cfg, wl = workload_args(argv, __doc__ or NAME, Workload(), QUICK)
    if min(wl.teams, wl.in_flight, wl.agents, wl.rounds, wl.context_tokens, wl.message_tokens, wl.reply_tokens) < 1:
        raise SystemExit("b9: every size >= 1 (warm_pool may be 0)")
    opts = WorkerOptions(
        model=cfg.model,
        num_pages=wl.pages(),
        dtype=cfg.dtype,
        max_model_len=max_len_for(wl.longest()),
        max_num_seqs=wl.in_flight * wl.agents,
    )
    started = time.perf_counter()
    result = BenchResult(NAME, config_dict(cfg, **asdict(wl), device_pages=opts.num_pages))
    worker = WorkerProcess(opts)
    server = VLLMServer(
        cfg.model,
        baseline_blocks(opts),
        dtype=cfg.dtype,
        max_num_seqs=opts.max_num_seqs,
        max_model_len=opts.max_model_len,
        extra_flags=("--enable-prompt-tokens-details",),
    )
    try:
        server.wait_ready()
        worker.wait_ready()
        with control_plane(worker, wl) as stack, worker.sample_pages():
            run(stack, server, cfg, wl, result)
        fill_sides(result, worker, server)
        result.memory = worker.memory()
    finally:
        server.close()
        worker.close()
    result.wall_s = time.perf_counter() - started
    result.print()
    print(f"  wrote {result.write()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
