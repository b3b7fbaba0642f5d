"""B11 — multi-turn chat through the OpenAI protocol: Symphony's ``/v1`` vs ``vllm serve``.

Both sides are driven by the ``openai`` client, as a user's application would drive them:

- **Symphony**: the whole control plane as ``make up`` runs it (uvicorn on a migrated database,
  a tenant with an API key, a worker), requests answered by the built-in OpenAI program;
- **baseline**: ``vllm serve`` with prefix caching (``bench/baseline_server.py``), the same model,
  dtype, KV blocks, max batch and max length, with ``--enable-prompt-tokens-details`` so it
  reports ``cached_tokens``.

(a) **Multi-turn chat**: ``conversations`` conversations of ``turns`` turns share one system
prompt of ~``system_tokens`` tokens; each turn adds a ~``user_tokens``-token user message,
asks for ``answer_tokens`` tokens (greedy, streamed with usage) and appends the side's own
answer to the history; ``in_flight`` conversations at once. Reported per side: requests/s, TTFT
p50 (first non-empty content chunk) and the cached share of prompt tokens
(``usage.prompt_tokens_details.cached_tokens`` where reported, else 0). Each repetition uses a
system prompt and user turns of its own, so no side starts a repetition with the last one's cache.

(b) **Responses**: ``responses_conversations`` conversations of the same shape (default 48,
about three times what the device KV holds) through Symphony's ``/v1/responses`` with
``previous_response_id`` (only the new turn is sent) against the same ``vllm serve`` given the
whole history, turn by turn across all conversations (so all are live at once). **Hook**:
skipped, with the reason in the record's notes, while Symphony answers ``/v1/responses`` with a
404 (a build without it).

**Tracing on vs off** (``--tracing-ab 1``, default in full mode): a second worker started with
``--trace off`` and a second web process on it; each repetition of (a) also runs on that stack,
next to the traced one (on, off, vLLM; then vLLM, off, on), and the row "(a) multi-turn chat,
tracing on vs off" compares the two. Because two runs of (a) differ by more than 1% from one
repetition to the next here, the record also keeps the spans' cost measured directly: the
traced runs' ``pred`` calls (their usage records, which bill each step of a multi-step call:
more than the one span per call the worker records, so an upper bound) times one span's CPU
time (``bench/trace_cost.py``) over the repetition's wall time.

**1-token latency**: sequential non-streamed requests of one short user message and
``max_tokens=1``; p50 per side (target: within 50 ms of ``vllm serve``), and for
Symphony the split of its time by phase from the run's row (:data:`PHASES`). With
``--sandbox-path 1`` (default in full mode; needs docker with runsc) a second web process with
``SYMPHONY_TRUSTED_BUILTIN=0`` and a Celery executor with a warm sandbox pool measure the same
through the ordinary path (Celery hop + gVisor sandbox): the cost the in-process path removes.

The database is ``DATABASE_URL``'s (created if missing, then migrated); the tenant is a fresh
``b11-…`` one on a ``bench-b11`` plan without rate or concurrency limits that would queue the
benchmark's own requests.
"""

from __future__ import annotations

import contextlib
import functools
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from bench.control_plane import Processes, control_plane_env, database_ready
from bench.harness import (
    BenchResult,
    Comparison,
    Sample,
    WorkerOptions,
    WorkerProcess,
    baseline_blocks,
    config_dict,
    fill_sides,
    max_len_for,
    repetition_starts,
    rng,
    share_out,
    workload_args,
)
from bench.trace_cost import span_share, trace_call_cost_us

NAME = "b11_multiturn"
PLAN = "bench-b11"
#: Words the synthetic prompts are drawn from (fixed, so a rerun sends the same text).
WORDS = (
    "river stone light market garden window paper silver forest engine winter harbor signal "
    "pencil orange museum thunder copper meadow bridge lantern castle violet planet rocket "
    "island canyon marble velvet candle mirror anchor blanket cotton desert falcon glacier "
    "harvest jungle kettle ladder magnet needle oyster pepper quartz saddle tunnel umbrella "
    "walnut yellow zipper basket carpet dragon feather guitar helmet jacket kitten lemon "
    "monkey napkin orchid parrot rabbit salmon tomato valley wizard"
).split()
#: A request's bounded wait, seconds.
REQUEST_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Workload:
    conversations: int = 16
    turns: int = 6
    system_tokens: int = 600
    user_tokens: int = 40
    answer_tokens: int = 32
    in_flight: int = 4
    #: 1-token requests per side and repetition (after two unmeasured warm-ups).
    latency_requests: int = 20
    #: Also measure the 1-token latency through Celery + the gVisor sandbox (needs docker).
    sandbox_path: int = 1
    #: Run part (b) when Symphony serves ``/v1/responses``.
    responses: int = 1
    #: Live conversations in part (b): far more than the device KV holds (``pages``), so each
    #: side's history has to leave the device between turns, which is what (b) compares.
    responses_conversations: int = 48
    #: Also run (a) on a second stack whose worker records no spans (``--trace off``): what
    #: per-run tracing costs a chat workload.
    tracing_ab: int = 1

    def conversation_tokens(self) -> int:
        """An upper bound of a conversation's final prompt (chat template overhead included)."""
        return self.system_tokens + self.turns * (self.user_tokens + self.answer_tokens + 16) + 32

    def conversation_pages(self, block: int = 128) -> int:
        """KV pages (vLLM blocks) one conversation holds at its longest."""
        return -(-self.conversation_tokens() // block)

    def pages(self, block: int = 128) -> int:
        """Device KV, the same number of pages for the worker and vLLM's blocks: room for twice
        the conversations in flight at their longest, so (a) never waits for KV, while (b)'s
        ``conversations`` live at once hold more than that (``conversations > 2 * in_flight``):
        part of every side's history has to leave the device between its turns."""
        return 2 * self.in_flight * self.conversation_pages(block) + 2

    @property
    def host_pages(self) -> int:
        """The worker's host tier: every conversation of (b) at its longest, what the run may
        spill there. vLLM gets these pages on top of the device's (the protocol's equal KV
        bytes: on a CPU host the host tier is the same DRAM), so (b) measures what each side
        does with equal memory, not a larger cache against a smaller one."""
        return self.responses_conversations * self.conversation_pages() if self.responses else 0


QUICK = Workload(
    conversations=4,
    turns=3,
    system_tokens=200,
    user_tokens=20,
    answer_tokens=8,
    in_flight=2,
    latency_requests=8,
    sandbox_path=0,
    responses_conversations=6,
    tracing_ab=0,
)


# ------------------------------------------------------------------------------ prompts
class Texts:
    """Synthetic text of about N tokens of the model's own tokenizer, from fixed seeds."""

    def __init__(self, model: str) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model)

    def text(self, tokens: int, seed: int, *salt: int) -> str:
        gen = rng(seed, *salt)
        words: list[str] = []
        while True:
            words.extend(gen.choice(WORDS, size=max(4, tokens // 4)).tolist())
            text = " ".join(words)
            if len(self.tokenizer.encode(text, add_special_tokens=False)) >= tokens:
                return text


@dataclass(frozen=True)
class Script:
    """One repetition's conversations: the shared system prompt and every user turn."""

    system: str
    users: list[list[str]]


def script(texts: Texts, wl: Workload, seed: int, rep: int) -> Script:
    system = "You are a helpful assistant. " + texts.text(wl.system_tokens, seed, rep, 0)
    users = [
        [texts.text(wl.user_tokens, seed, rep, 1 + c, t) for t in range(wl.turns)] for c in range(wl.conversations)
    ]
    return Script(system, users)


# ------------------------------------------------------------------------------ sides
@dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible server as the ``openai`` client sees it."""

    name: str
    base_url: str
    api_key: str
    model: str

    def client(self) -> Any:
        from openai import OpenAI

        return OpenAI(base_url=f"{self.base_url}/v1", api_key=self.api_key, max_retries=0, timeout=REQUEST_TIMEOUT_S)


@dataclass
class Turn:
    ttft_s: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int


def _cached(usage: Any) -> int:
    details = getattr(usage, "prompt_tokens_details", None)
    return int(getattr(details, "cached_tokens", 0) or 0) if details is not None else 0


def chat_turn(client: Any, model: str, messages: list[dict], max_tokens: int) -> tuple[str, Turn]:
    """One streamed greedy turn: (answer text, its timings and usage)."""
    started = time.perf_counter()
    stream = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    ttft: float | None = None
    first_chunk: float | None = None
    parts: list[str] = []
    usage = None
    for chunk in stream:
        if chunk.choices:
            first_chunk = first_chunk or time.perf_counter() - started
            content = chunk.choices[0].delta.content
            if content:
                ttft = ttft or time.perf_counter() - started
                parts.append(content)
        if chunk.usage is not None:
            usage = chunk.usage
    if usage is None:
        raise RuntimeError("the server sent no usage chunk (stream_options.include_usage)")
    at = ttft or first_chunk or time.perf_counter() - started
    return "".join(parts), Turn(at, usage.prompt_tokens, _cached(usage), usage.completion_tokens)


@dataclass
class Run:
    """One side's pass over one repetition's conversations."""

    wall_s: float
    turns: list[Turn] = field(default_factory=list)

    @property
    def requests_per_s(self) -> float:
        return len(self.turns) / self.wall_s

    @property
    def ttft_p50(self) -> float:
        return statistics.median(t.ttft_s for t in self.turns)

    @property
    def cached_share(self) -> float:
        prompt = sum(t.prompt_tokens for t in self.turns)
        return sum(t.cached_tokens for t in self.turns) / prompt if prompt else 0.0


def multiturn(endpoint: Endpoint, sc: Script, wl: Workload) -> Run:
    """(a): each of ``in_flight`` threads takes whole conversations, one after the other."""

    def converse(_: int, c: int) -> list[Turn]:
        client = endpoint.client()
        messages: list[dict] = [{"role": "system", "content": sc.system}]
        turns = []
        for user in sc.users[c]:
            messages.append({"role": "user", "content": user})
            answer, turn = chat_turn(client, endpoint.model, messages, wl.answer_tokens)
            messages.append({"role": "assistant", "content": answer})
            turns.append(turn)
        client.close()
        return turns

    started = time.perf_counter()
    per_conversation = share_out(list(range(wl.conversations)), wl.in_flight, converse)
    run = Run(time.perf_counter() - started)
    for turns in per_conversation:
        run.turns.extend(turns)
    return run


def warm_up(endpoint: Endpoint, wl: Workload) -> None:
    """The protocol's warm-up, off the clock: one short conversation of two streamed turns, so
    no side's first timed request pays for its first connections, imports or compilation."""
    multiturn(endpoint, Script("Warm-up.", [["Say hello.", "Say goodbye."]]), replace(wl, conversations=1, in_flight=1))


#: Where a Symphony 1-token request's time goes, from the client's clock and the run's row.
PHASES = (
    "request -> run created",
    "created -> started (dispatch)",
    "started -> first output (session, program start, prefill)",
    "first output -> finished (end session, record)",
    "finished -> client has the answer",
)


def one_token(endpoint: Endpoint, n: int, phases: dict[str, list[float]] | None = None) -> float:
    """p50 seconds of ``n`` sequential 1-token chat requests (two warm-ups first). For
    Symphony (``phases`` given) each request's run row splits its time into :data:`PHASES`."""
    client = endpoint.client()
    messages = [{"role": "user", "content": "Say yes."}]
    times = []
    for i in range(n + 2):
        sent = time.time()
        started = time.perf_counter()
        raw = client.chat.completions.with_raw_response.create(
            model=endpoint.model, messages=messages, max_tokens=1, temperature=0
        )
        elapsed = time.perf_counter() - started
        received = time.time()
        out = raw.parse()
        if out.usage is None or out.usage.completion_tokens > 1:
            raise RuntimeError(f"{endpoint.name}: not a 1-token answer: {out}")
        if i < 2:
            continue
        times.append(elapsed)
        if phases is not None:
            for name, value in _phases(raw.headers["X-Symphony-Run-Id"], sent, received).items():
                phases.setdefault(name, []).append(value)
    client.close()
    return statistics.median(times)


def _phases(run_id: str, sent: float, received: float) -> dict[str, float]:
    from api.models import Run

    run = Run.objects.get(pk=run_id)
    created, started, finished = run.created_at.timestamp(), run.started_at.timestamp(), run.finished_at.timestamp()
    first = run.first_output_at.timestamp() if run.first_output_at else finished
    values = (created - sent, started - created, first - started, finished - first, received - finished)
    return dict(zip(PHASES, values, strict=True))


def phase_note(side: str, phases: dict[str, list[float]]) -> str:
    parts = [f"{name} {1000 * statistics.median(v):.0f} ms" for name, v in phases.items()]
    return f"{side} 1-token p50 by phase: " + "; ".join(parts)


# ------------------------------------------------------------------ tracing on vs off
class TracingSides:
    """(a) with tracing on (the ordinary stack) against the same on a worker started with
    ``--trace off`` (``off``; None: not measured), and the spans' cost measured directly: the
    ``pred`` calls the traced runs made, from their usage records, times one span's CPU time."""

    def __init__(self, tenant: str, off: Endpoint | None) -> None:
        self.tenant = tenant
        self.off = off
        self.ab = Comparison("(a) multi-turn chat, tracing on vs off", "req/s")
        #: Per traced repetition: (pred calls, wall seconds).
        self.calls: list[tuple[int, float]] = []

    def timed(self, fn: Callable[..., Run], *args: Any) -> Run:
        """Run (a) on the traced stack, counting the ``pred`` calls its runs were billed (only
        while the A/B is measured: nothing reads them otherwise)."""
        if self.off is None:
            return fn(*args)
        from django.db.models import Sum
        from django.utils import timezone

        from api.models import UsageRecord

        since = timezone.now()
        run = fn(*args)
        records = UsageRecord.objects.filter(run__tenant__slug=self.tenant, run__created_at__gte=since)
        self.calls.append((int(records.aggregate(n=Sum("pred_calls"))["n"] or 0), run.wall_s))
        return run

    def comparison(self) -> Comparison:
        cost = trace_call_cost_us()
        per_call_us = max(cost["spans_kept_us"], cost["bucketed_us"])
        shares = [span_share(calls, per_call_us, wall) for calls, wall in self.calls]
        share = statistics.median(shares)
        calls = statistics.median(c for c, _ in self.calls)
        self.ab.extra = {
            "trace_call_us": cost,
            "pred_calls_per_rep": [calls for calls, _ in self.calls],
            "span_share": share,
            "span_shares": shares,
            "note": (
                f"span work {100 * share:.3f}% of a repetition's wall time ({calls:.0f} pred calls x "
                f"{per_call_us:.1f} us), measured directly"
            ),
        }
        return self.ab


# ------------------------------------------------------------------- part (b): the hook
def responses_unavailable(endpoint: Endpoint) -> str | None:
    """Why part (b) cannot run against ``endpoint`` (None: it can): ``/v1/responses`` must be
    served (an empty body is then a 400 in OpenAI's envelope, not a 404)."""
    import httpx

    headers = {"Authorization": f"Bearer {endpoint.api_key}"}
    answer = httpx.post(f"{endpoint.base_url}/v1/responses", json={}, headers=headers, timeout=60)
    if answer.status_code in (404, 405):
        return f"/v1/responses is not served by this build (HTTP {answer.status_code})"
    return None


def responses_turns(endpoint: Endpoint, sc: Script, wl: Workload) -> Run:
    """(b), Symphony: turn-major over all conversations (all of them live at once), each turn
    sending only the new user message with ``previous_response_id``. Afterwards (off the clock)
    every stored response is deleted, which removes the conversations' KV files: the worker
    would otherwise write them to the store once idle (``SYMPHONY_KV_LAZY_WRITE_S``), while
    the other side is being measured."""
    previous: list[str | None] = [None] * wl.conversations
    stored: list[str] = []
    run = Run(0.0)
    started = time.perf_counter()
    for t in range(wl.turns):

        def turn(_: int, c: int, t: int = t) -> Turn:
            client = endpoint.client()
            begun = time.perf_counter()
            kwargs: dict[str, Any] = {"previous_response_id": previous[c]} if previous[c] else {}
            out = client.responses.create(
                model=endpoint.model,
                instructions=sc.system,
                input=sc.users[c][t],
                max_output_tokens=wl.answer_tokens,
                temperature=0,
                store=True,
                **kwargs,
            )
            elapsed = time.perf_counter() - begun
            previous[c] = out.id
            stored.append(out.id)
            details = getattr(out.usage, "input_tokens_details", None)
            cached = int(getattr(details, "cached_tokens", 0) or 0) if details is not None else 0
            client.close()
            return Turn(elapsed, out.usage.input_tokens, cached, out.usage.output_tokens)

        run.turns.extend(share_out(list(range(wl.conversations)), wl.in_flight, turn))
    run.wall_s = time.perf_counter() - started
    client = endpoint.client()
    for response_id in stored:
        client.responses.delete(response_id)
    client.close()
    return run


def chat_turns_turn_major(endpoint: Endpoint, sc: Script, wl: Workload) -> Run:
    """(b), baseline: the same order, each turn re-sending the whole history."""
    histories: list[list[dict]] = [[{"role": "system", "content": sc.system}] for _ in range(wl.conversations)]
    run = Run(0.0)
    started = time.perf_counter()
    for t in range(wl.turns):

        def turn(_: int, c: int, t: int = t) -> Turn:
            client = endpoint.client()
            histories[c].append({"role": "user", "content": sc.users[c][t]})
            answer, stat = chat_turn(client, endpoint.model, histories[c], wl.answer_tokens)
            histories[c].append({"role": "assistant", "content": answer})
            client.close()
            return stat

        run.turns.extend(share_out(list(range(wl.conversations)), wl.in_flight, turn))
    run.wall_s = time.perf_counter() - started
    return run


# ------------------------------------------------------------------------------ Symphony
def _tenant_key() -> tuple[str, str]:
    """A fresh tenant on the benchmark's plan: (its slug, an API key of it in plaintext)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "web.settings")
    import django

    django.setup()
    from django.contrib.auth import get_user_model

    from api.models import Membership, Plan, Tenant
    from api.services.keys import issue_key
    from api.tenancy import KEY_SCOPES

    limits = {
        "max_concurrent_runs": 256,
        "max_tokens_per_run": 32768,
        "max_run_seconds": 1800,
        "tokens_per_month": None,
        "api_requests_per_minute": None,
        "max_concurrent_streams": 256,
        "max_device_pages_per_run": None,
    }
    Plan.objects.update_or_create(name=PLAN, defaults=limits)
    slug = f"b11-{uuid.uuid4().hex[:8]}"
    tenant = Tenant.objects.create(name=slug, slug=slug, plan=PLAN)
    user = get_user_model().objects.create_user(username=f"{slug}@example.com", email=f"{slug}@example.com")
    Membership.objects.create(user=user, tenant=tenant, role="owner")
    return slug, issue_key(tenant, "b11", list(KEY_SCOPES), user).secret


def _worker_env(worker: WorkerProcess) -> dict[str, str]:
    """What a web process or executor needs to reach ``worker`` (statically routed)."""
    return {
        "SYMPHONY_WORKER_NAME": worker.opts.name,
        "SYMPHONY_WORKER_ADMIN_SOCKET": worker.admin_socket,
        "SYMPHONY_SESSIONS_DIR": str(worker.base / "s"),
        "SYMPHONY_ROUTING": "static",
        "SYMPHONY_OPENAI_QUEUE_S": "60",
    }


@dataclass(frozen=True)
class Stack:
    """The web processes' URLs: the in-process path, the sandbox path (or None), and the
    in-process path on the worker without tracing (or None)."""

    fast: str
    slow: str | None
    untraced: str | None


@contextlib.contextmanager
def symphony_stack(
    worker: WorkerProcess, sandbox_path: bool, untraced: WorkerProcess | None = None
) -> Iterator[tuple[Stack, Processes]]:
    procs = Processes()
    common = _worker_env(worker)
    try:
        fast = procs.web("web-trusted", control_plane_env(**common, SYMPHONY_TRUSTED_BUILTIN="1"))
        off = None
        if untraced is not None:
            off = procs.web("web-untraced", control_plane_env(**_worker_env(untraced), SYMPHONY_TRUSTED_BUILTIN="1"))
        slow = None
        if sandbox_path:
            from sandbox.image import ensure

            image = ensure(log=lambda m: None)
            executor = control_plane_env(**common, SYMPHONY_SANDBOX_IMAGE=image, SYMPHONY_SANDBOX_POOL_SIZE="1")
            celery = [sys.executable, "-m", "celery", "-A", "web", "worker", "-Q", "worker.bench", "--pool", "solo"]
            procs.start("celery", [*celery, "--loglevel", "WARNING", "--without-gossip", "--without-mingle"], executor)
            slow = procs.web(
                "web-sandbox", control_plane_env(**common, SYMPHONY_TRUSTED_BUILTIN="0", SYMPHONY_SANDBOX_IMAGE=image)
            )
        yield Stack(fast, slow, off), procs
    finally:
        procs.close()


# ------------------------------------------------------------------------------ main
def _vllm_server(cfg: Any, opts: WorkerOptions) -> Any:
    """``vllm serve`` with the worker's KV (device + host pages), batch, dtype and length."""
    from bench.baseline_server import VLLMServer

    return VLLMServer(
        cfg.model,
        baseline_blocks(opts),
        dtype=cfg.dtype,
        max_num_seqs=opts.max_num_seqs,
        max_model_len=opts.max_model_len,
        extra_flags=["--enable-prompt-tokens-details"],
    )


def measure(cfg: Any, wl: Workload, result: BenchResult) -> None:
    max_len = max_len_for(wl.conversation_tokens())
    pages = max(wl.pages(), max_len // 128 + 2)
    result.config["device_pages"] = pages
    texts = Texts(cfg.model)
    opts = WorkerOptions(
        model=cfg.model,
        num_pages=pages,
        dtype=cfg.dtype,
        max_model_len=max_len,
        max_num_seqs=max(8, 2 * wl.in_flight),
        host_pages=wl.host_pages,
    )
    worker = WorkerProcess(opts)
    untraced = WorkerProcess(replace(opts, name="bench-untraced", trace=False)) if wl.tracing_ab else None
    server = _vllm_server(cfg, opts)
    try:
        database_ready()
        tenant, key = _tenant_key()
        worker.wait_ready()
        if untraced is not None:
            untraced.wait_ready()
        server.wait_ready()
        with symphony_stack(worker, bool(wl.sandbox_path), untraced) as (stack, procs):
            symphony = Endpoint("symphony", stack.fast, key, "bench")
            vllm = Endpoint("vllm serve", f"http://127.0.0.1:{server.port}", "none", "bench")
            off = Endpoint("symphony (tracing off)", stack.untraced, key, "bench") if stack.untraced else None
            try:
                _measure_sides(cfg, wl, texts, symphony, vllm, stack.slow, key, result, TracingSides(tenant, off))
                fill_sides(result, worker, server)
            except Exception:
                for name, _, _ in procs.procs:
                    print(f"--- {name} log tail:\n{procs.tail(name)}", file=sys.stderr)
                raise
        result.memory = worker.memory()
    finally:
        server.close()
        worker.close()
        if untraced is not None:
            untraced.close()


def _measure_sides(
    cfg: Any,
    wl: Workload,
    texts: Texts,
    symphony: Endpoint,
    vllm: Endpoint,
    slow_url: str | None,
    key: str,
    result: BenchResult,
    tracing: TracingSides,
) -> None:
    chat = Comparison("(a) multi-turn chat", "req/s")
    ttft = Comparison("(a) TTFT p50", "s", higher_is_better=False)
    cached: dict[str, list[float]] = {"symphony": [], "vllm": []}
    token = Comparison("1-token request p50", "s", higher_is_better=False)
    sandboxed = Comparison("1-token p50, sandbox path (SYMPHONY_TRUSTED_BUILTIN=0)", "s", higher_is_better=False)
    slow = Endpoint("symphony (sandbox path)", slow_url, key, "bench") if slow_url else None
    fast_phases: dict[str, list[float]] = {}
    slow_phases: dict[str, list[float]] = {}
    for endpoint in (symphony, tracing.off, vllm):
        if endpoint is not None:
            warm_up(endpoint, wl)
    for rep in range(cfg.reps):
        repetition_starts()
        sc = script(texts, wl, cfg.seed, rep)
        sides: list[tuple[str, Callable[[], Run]]] = [
            ("symphony", functools.partial(tracing.timed, multiturn, symphony, sc, wl)),
            ("vllm", functools.partial(multiturn, vllm, sc, wl)),
        ]
        if tracing.off is not None:  # on and off back to back: (on, off, vLLM), then (vLLM, off, on)
            sides.insert(1, ("untraced", functools.partial(multiturn, tracing.off, sc, wl)))
        for side, fn in sides if rep % 2 == 0 else reversed(sides):
            run = fn()
            if side == "untraced":
                tracing.ab.baseline.add(run.requests_per_s)
                continue
            if side == "symphony":
                tracing.ab.symphony.add(run.requests_per_s)
            target = chat.symphony if side == "symphony" else chat.baseline
            target.add(run.requests_per_s)
            (ttft.symphony if side == "symphony" else ttft.baseline).add(run.ttft_p50)
            cached[side].append(run.cached_share)
        token.symphony.add(one_token(symphony, wl.latency_requests, fast_phases))
        vllm_p50 = one_token(vllm, wl.latency_requests)
        token.baseline.add(vllm_p50)
        if slow is not None:
            sandboxed.symphony.add(one_token(slow, wl.latency_requests, slow_phases))
            sandboxed.baseline.add(vllm_p50)
    chat.extra = {
        "symphony_cached_share": statistics.median(cached["symphony"]),
        "vllm_cached_share": statistics.median(cached["vllm"]),
        "symphony_cached_shares": cached["symphony"],
        "vllm_cached_shares": cached["vllm"],
        "note": (
            f"cached_tokens share: Symphony {statistics.median(cached['symphony']):.0%}, "
            f"vLLM {statistics.median(cached['vllm']):.0%}"
        ),
    }
    difference_ms = 1000 * (token.symphony.median - token.baseline.median)
    token.extra = {
        "difference_ms": difference_ms,
        "phases_ms": {k: 1000 * statistics.median(v) for k, v in fast_phases.items()},
        "note": f"Symphony - vLLM: {difference_ms:+.0f} ms",
    }
    result.comparisons += [chat, ttft, token]
    if tracing.off is not None:
        result.comparisons.append(tracing.comparison())
    result.notes.append(phase_note("in-process path", fast_phases))
    if slow is not None:
        slow_ms = 1000 * (sandboxed.symphony.median - sandboxed.baseline.median)
        sandboxed.extra = {
            "difference_ms": slow_ms,
            "phases_ms": {k: 1000 * statistics.median(v) for k, v in slow_phases.items()},
            "note": f"without the in-process path: {slow_ms:+.0f} ms",
        }
        result.comparisons.append(sandboxed)
        result.notes.append(phase_note("sandbox path (Celery + gVisor)", slow_phases))
    _part_b(cfg, wl, texts, symphony, vllm, result)


def _part_b(cfg: Any, wl: Workload, texts: Texts, symphony: Endpoint, vllm: Endpoint, result: BenchResult) -> None:
    """(b) — the hook for ``/v1/responses``: measured when served, else a note saying why not."""
    reason = "disabled (--responses 0)" if not wl.responses else responses_unavailable(symphony)
    if reason is not None:
        result.notes.append(f"(b) /v1/responses with previous_response_id: skipped: {reason}")
        result.config["responses_skipped"] = reason
        return
    cmp = Comparison("(b) responses, previous_response_id", "req/s")
    cached: dict[str, list[float]] = {"symphony": [], "vllm": []}
    wl = replace(wl, conversations=wl.responses_conversations)
    for rep in range(cfg.reps):
        repetition_starts()
        sc = script(texts, wl, cfg.seed, 1000 + rep)
        sides: list[tuple[str, Sample, Callable[[], Run]]] = [
            ("symphony", cmp.symphony, functools.partial(responses_turns, symphony, sc, wl)),
            ("vllm", cmp.baseline, functools.partial(chat_turns_turn_major, vllm, sc, wl)),
        ]
        for side, sample, fn in sides if rep % 2 == 0 else reversed(sides):
            run = fn()
            sample.add(run.requests_per_s)
            cached[side].append(run.cached_share)
    live, pages = wl.conversations * wl.conversation_pages(), int(result.config["device_pages"])
    # The system prompt's full blocks are one copy on both sides (vLLM's prefix cache, the
    # worker's): what has to leave the device is the conversations' own tails.
    shared = wl.system_tokens // 128
    distinct = wl.conversations * (wl.conversation_pages() - shared) + shared
    cmp.extra = {
        "symphony_cached_share": statistics.median(cached["symphony"]),
        "vllm_cached_share": statistics.median(cached["vllm"]),
        "symphony_cached_shares": cached["symphony"],
        "vllm_cached_shares": cached["vllm"],
        "live_conversation_pages": live,
        "distinct_live_pages": distinct,
        "device_pages": pages,
        "note": (
            f"cached_tokens share: Symphony {statistics.median(cached['symphony']):.0%}, "
            f"vLLM {statistics.median(cached['vllm']):.0%}; {wl.conversations} live conversations "
            f"need up to {live} KV pages at their longest ({distinct} distinct: the system prompt's {shared} "
            f"full blocks are shared); the worker's device holds {pages} pages and its host tier "
            f"{wl.host_pages}, vLLM {pages + wl.host_pages} blocks (equal KV bytes)"
        ),
    }
    result.comparisons.append(cmp)


def main(argv: list[str] | None = None) -> int:
    cfg, wl = workload_args(argv, __doc__ or NAME, Workload(), QUICK)
    started = time.perf_counter()
    result = BenchResult(NAME, config_dict(cfg, **asdict(wl)))
    measure(cfg, wl, result)
    result.notes.append(
        "both sides through the openai client on one machine, interleaved (S, B then B, S): absolute "
        "figures drift with whatever else runs there, the ratios are what to read"
    )
    result.wall_s = time.perf_counter() - started
    result.print()
    print(f"  wrote {result.write()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
