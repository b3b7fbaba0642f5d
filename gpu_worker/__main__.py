"""``python -m gpu_worker`` runs a worker; ``python -m gpu_worker health`` probes one (exit 0/1)."""

from __future__ import annotations

import os

# OpenMP threads (the CPU backend's forward) that finish a parallel region early spin at the
# barrier before sleeping (libgomp's default ACTIVE-then-sleep). On a CPU host shared with
# sandboxes, executors and other workers, the spinning thread burns the core its partner needs:
# forwards measured ~10x slower under load (bench/NOTES.md, B10). Sleeping at once costs a
# wake-up per region on an idle host and nothing on a GPU. Set OMP_WAIT_POLICY to override;
# it must be in the environment before torch (and its OpenMP runtime) loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import asyncio
import dataclasses
import json
import logging
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from gpu_worker.config import (
    ConnectionLimits,
    GrammarConfig,
    SchedulerConfig,
    WorkerConfig,
    connection_limits_from_env,
    env_defaults,
)
from gpu_worker.stream_ledger import StreamBudget

log = logging.getLogger("gpu_worker")


def _fraction(value: str) -> float:
    share = float(value)
    if not 0.0 <= share <= 1.0:
        raise argparse.ArgumentTypeError("must be a fraction in [0, 1]")
    return share


def _on_off(value: str) -> bool:
    """An argparse type: ``on`` or ``off`` (as ``--trace`` and ``SYMPHONY_WORKER_TRACE`` take)."""
    word = value.strip().lower()
    if word not in ("on", "off"):
        raise argparse.ArgumentTypeError("must be 'on' or 'off'")
    return word == "on"


def _count_or_off(minimum: int) -> Callable[[str], int | None]:
    """An argparse type: an integer >= ``minimum``, or ``off`` (``None``: no bound), as
    ``--contended-prefill-slack`` (tokens, >= 0) and ``--contended-seats`` (seats, >= 1) take."""

    def parse(value: str) -> int | None:
        if value.lower() == "off":
            return None
        count = int(value)
        if count < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum} or 'off'")
        return count

    return parse


def _at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer >= ``minimum``."""

    def parse(value: str) -> int:
        count = int(value)
        if count < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}")
        return count

    return parse


def _tokens_or_auto(value: str) -> int | None:
    """An argparse type: a token count >= 1, or ``auto`` (``None``: derived from measured cost),
    as ``--contended-step-tokens`` takes."""
    if value.lower() == "auto":
        return None
    count = int(value)
    if count < 1:
        raise argparse.ArgumentTypeError("must be >= 1 or 'auto'")
    return count


def _positive(cast: Callable[[str], float]) -> Callable[[str], float]:
    """An argparse type: a number of ``cast`` above 0."""

    def parse(value: str) -> float:
        number = cast(value)
        if number <= 0:
            raise argparse.ArgumentTypeError("must be > 0")
        return number

    return parse


def _not_negative(value: str) -> float:
    """An argparse type: seconds >= 0."""
    number = float(value)
    if number < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return number


def _parser() -> argparse.ArgumentParser:
    env = env_defaults()
    p = argparse.ArgumentParser(prog="python -m gpu_worker", description=__doc__)
    p.add_argument("command", nargs="?", choices=["serve", "health"], default="serve")
    p.add_argument("--model", default=env["model_dir"])
    p.add_argument("--admin-socket", default=env["admin_socket"])
    p.add_argument("--sessions-dir", default=env["sessions_dir"])
    p.add_argument("--kv-store", default=env["kv_store_dir"], help="directory, or s3://bucket/prefix")
    p.add_argument("--name", default=env["name"], help="worker name; Celery routes runs to queue worker.<name>")
    p.add_argument("--kv-cache-gib", type=float, default=env["kv_cache_gib"])
    p.add_argument("--num-pages", type=int, default=None)
    p.add_argument("--host-pages", type=int, default=4096)
    p.add_argument(
        "--kv-pinned-fraction",
        type=_fraction,
        default=env["kv_pinned_fraction"],
        help="most of the device KV pool all tenants' pinned files together may hold",
    )
    p.add_argument(
        "--kv-store-bytes",
        type=int,
        default=env["kv_store_bytes"],
        help="bytes the KV store may keep for named files (default: its free disk at start plus its files)",
    )
    p.add_argument(
        "--kv-account-reserve",
        type=_fraction,
        default=WorkerConfig.kv_account_reserve,
        help="share of the device KV pool no one account may hold, kept for the others "
        "(0: a worker that serves one account, e.g. a benchmark against a single-tenant server)",
    )
    p.add_argument(
        "--prefix-cache",
        action=argparse.BooleanOptionalAction,
        default=env["prefix_cache"],
        help="tenant-scoped automatic prefix cache in KVFS (gpu_worker/kvfs/prefix.py); "
        "SYMPHONY_PREFIX_CACHE=0 turns it off",
    )
    p.add_argument(
        "--kv-lazy-write-s",
        type=float,
        default=env["kv_lazy_write_s"],
        help="seconds a closed durable=False KV file (a /v1/responses conversation's) keeps changes "
        "unwritten to the store; SYMPHONY_KV_LAZY_WRITE_S",
    )
    p.add_argument(
        "--trace",
        type=_on_off,
        default=env["trace"],
        help="per-run traces: 'off' records no span per call, and a run's trace says tracing was off"
        " on this worker; SYMPHONY_WORKER_TRACE (default on)",
    )
    p.add_argument(
        "--dtype",
        default="auto",
        help="auto: the checkpoint's dtype on a GPU or a CPU with native bf16, else float32"
        " (exact greedy and seeded results; gpu_worker/dtype_choice.py)",
    )
    p.add_argument(
        "--compile",
        choices=["on", "off"],
        default=env["compile"],
        help="on CPU, run the model compiled by vLLM (Dynamo + Inductor; the first start with a new "
        "configuration compiles for minutes, later starts load the cache) or eagerly; SYMPHONY_COMPILE",
    )
    p.add_argument("--compile-cache", default=env["compile_cache_dir"], help="directory of the compiled-code cache")
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-batch-wait-ms", type=float, default=50.0, help="cap on a batch's wait for more calls")
    p.add_argument(
        "--batch-wait-fraction", type=float, default=0.25, help="a batch waits at most this share of a forward's time"
    )
    p.add_argument("--io-swap-threshold-s", type=float, default=0.5)
    p.add_argument(
        "--contended-prefill-slack",
        type=_count_or_off(0),
        default=SchedulerConfig.contended_prefill_slack,
        help="tokens a contended prefill chunk may take its tenant above those left out ('off': no bound)",
    )
    conn = connection_limits_from_env()
    for f in dataclasses.fields(ConnectionLimits):
        p.add_argument(
            "--" + f.name.replace("_", "-"),
            type=float if f.type == "float" else int,
            default=getattr(conn, f.name),
            help=f"session connections (env SYMPHONY_WORKER_{f.name.upper()}; default %(default)s)",
        )
    p.add_argument(
        "--contended-seats",
        type=_count_or_off(1),
        default=SchedulerConfig.contended_seats_per_tenant,
        help="while other accounts are served, one account takes no more calls of a forward than the "
        "widest of them, and at least this many ('off': no cap)",
    )
    p.add_argument(
        "--contended-step-tokens",
        type=_tokens_or_auto,
        default=SchedulerConfig.contended_step_tokens,
        help="while several accounts have work, prefill tokens of one forward, each account its fair"
        " share ('auto': what keeps a forward within --contended-step-ratio decode forwards, measured)",
    )
    p.add_argument(
        "--contended-step-ratio",
        type=_positive(float),
        default=SchedulerConfig.contended_step_ratio,
        help="with --contended-step-tokens auto: how many decode-only forwards a contended forward may last",
    )
    grammar = GrammarConfig()
    p.add_argument(
        "--grammar-compile-processes",
        type=_at_least(2),
        default=grammar.processes,
        help="child processes compiling grammars (>= 2: one account may hold at most all but a quarter, at least 1)",
    )
    p.add_argument(
        "--grammar-compile-timeout-s",
        type=_positive(float),
        default=grammar.timeout_s,
        help="a grammar compile past this is killed and refused",
    )
    p.add_argument(
        "--grammar-kill-backoff-s",
        type=_not_negative,
        default=grammar.kill_backoff_s,
        help="after an account's compile is killed, its first-time compiles are refused this long (0: never)",
    )
    p.add_argument(
        "--grammar-kill-backoff-max-s",
        type=_not_negative,
        default=grammar.kill_backoff_max_s,
        help="each kill within this long of the account's previous one doubles its back-off, up to this",
    )
    p.add_argument(
        "--grammar-max-bytes", type=_positive(int), default=grammar.max_bytes, help="largest compiled grammar (bytes)"
    )
    p.add_argument(
        "--grammar-max-repeat",
        type=_positive(int),
        default=grammar.max_repeat,
        help="largest product of nested repetition bounds in a regex or schema pattern",
    )
    p.add_argument(
        "--grammar-max-depth", type=_positive(int), default=grammar.max_depth, help="deepest JSON schema nesting"
    )
    p.add_argument("--redis-url", default=env["redis_url"])
    budget = StreamBudget()
    p.add_argument(
        "--redis-headroom-bytes",
        type=_positive(int),
        default=budget.headroom_bytes,
        help="Redis memory kept out of the event-stream pool (broker, leases, counters)",
    )
    p.add_argument(
        "--redis-fallback-bytes",
        type=_positive(int),
        default=budget.fallback_bytes,
        help="Redis memory assumed when its maxmemory is 0 (unbounded)",
    )
    p.add_argument(
        "--stream-running-ttl-s",
        type=_positive(int),
        default=budget.running_ttl_s,
        help="TTL of a run's event stream while it writes, refreshed on every write",
    )
    p.add_argument("--log-level", default="INFO")
    p.add_argument("--timeout", type=float, default=5.0, help="health: seconds to wait for a reply")
    return p


def health(args: argparse.Namespace) -> int:
    from gpu_worker.admin_client import AdminClient

    try:
        out = AdminClient(args.admin_socket, timeout=args.timeout).health()
    except Exception as exc:
        print(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}))
        return 1
    print(json.dumps(out, default=str))
    return 0 if out.get("ok") else 1


def build_config(args: argparse.Namespace) -> WorkerConfig:
    return WorkerConfig(
        model_dir=str(args.model),
        admin_socket=str(args.admin_socket),
        # Absolute: session socket paths travel to the executor, which bind-mounts them into a
        # sandbox container, and Docker refuses a relative mount source.
        sessions_dir=os.path.abspath(args.sessions_dir),
        kv_store_dir=str(args.kv_store),
        name=args.name,
        kv_cache_gib=args.kv_cache_gib,
        num_pages=args.num_pages,
        dtype=args.dtype,
        compile=args.compile == "on",
        compile_cache_dir=os.path.abspath(args.compile_cache),
        max_model_len=args.max_model_len,
        host_pages=args.host_pages,
        kv_pinned_fraction=args.kv_pinned_fraction,
        kv_store_bytes=args.kv_store_bytes,
        kv_account_reserve=args.kv_account_reserve,
        prefix_cache=args.prefix_cache,
        kv_lazy_write_s=args.kv_lazy_write_s,
        trace=args.trace,
        redis_url=args.redis_url,
        stream_budget=StreamBudget(
            headroom_bytes=args.redis_headroom_bytes,
            fallback_bytes=args.redis_fallback_bytes,
            running_ttl_s=args.stream_running_ttl_s,
        ),
        conn=ConnectionLimits(**{f.name: getattr(args, f.name) for f in dataclasses.fields(ConnectionLimits)}),
        scheduler=SchedulerConfig(
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_num_seqs=args.max_num_seqs,
            max_batch_wait_s=args.max_batch_wait_ms / 1000,
            batch_wait_fraction=args.batch_wait_fraction,
            io_swap_threshold_s=args.io_swap_threshold_s,
            contended_prefill_slack=args.contended_prefill_slack,
            contended_seats_per_tenant=args.contended_seats,
            contended_step_tokens=args.contended_step_tokens,
            contended_step_ratio=args.contended_step_ratio,
        ),
        grammar=GrammarConfig(
            processes=args.grammar_compile_processes,
            timeout_s=args.grammar_compile_timeout_s,
            kill_backoff_s=args.grammar_kill_backoff_s,
            kill_backoff_max_s=args.grammar_kill_backoff_max_s,
            max_bytes=args.grammar_max_bytes,
            max_repeat=args.grammar_max_repeat,
            max_depth=args.grammar_max_depth,
        ),
    )


async def serve(config: WorkerConfig) -> None:
    from gpu_worker.start_beacon import StartBeacon

    # Executors let runs wait for a starting worker rather than fail them over (start_beacon.py);
    # a socket left by a process that died is not this one answering. Before the heavy imports.
    Path(config.admin_socket).unlink(missing_ok=True)
    beacon = StartBeacon(config.redis_url, config.name).start()
    import torch

    from gpu_worker import engine_otel
    from gpu_worker.dtype_choice import choose_dtype
    from gpu_worker.engine import Engine, EngineConfig
    from gpu_worker.engine_timeline import EngineTimeline
    from gpu_worker.events import EventPublisher
    from gpu_worker.grammar import GrammarCompiler, model_vocab_size
    from gpu_worker.kvfs import KVFS, KVFSLimits, store_from_location
    from gpu_worker.scheduler import EngineThread, PendingReleases, Scheduler
    from gpu_worker.server import Worker
    from gpu_worker.sessions import SessionTable
    from gpu_worker.tokenizer import Tokenizer

    sched = config.scheduler
    # The grammar children start while the engine loads (they are separate processes: the other
    # core's work); the worker answers nothing before they are ready (``Worker.start``).
    grammar = GrammarCompiler(config.model_dir, model_vocab_size(config.model_dir), config.grammar)
    grammar_started = asyncio.ensure_future(grammar.start())
    dtype, why = choose_dtype(config.dtype, on_gpu=torch.cuda.is_available())
    log.info("event=dtype_chosen requested=%s dtype=%s why=%s", config.dtype, dtype, why)
    # The engine is built on the thread that will run every forward (the scheduler's loop):
    # vLLM's CPU backend sets up its threads for the thread that builds it, and forwards from
    # another thread ran 20-25% slower (bench/NOTES.md, B3).
    engine_thread = EngineThread()
    engine = await asyncio.wrap_future(
        engine_thread.submit(
            Engine,
            EngineConfig(
                model_dir=config.model_dir,
                dtype=dtype,
                num_pages=config.num_pages,
                kv_cache_gib=config.kv_cache_gib,
                # Room for one call whose pending tokens (after merge/reload) exceed the budget.
                max_num_batched_tokens=sched.max_num_batched_tokens + config.max_model_len,
                max_num_seqs=sched.max_num_seqs,
                max_model_len=config.max_model_len,
                compile=config.compile,
                compile_cache_dir=config.compile_cache_dir,
            ),
        )
    )
    releases = PendingReleases()  # KVFS adds the sequences it releases, the scheduler drops them
    sessions = SessionTable()
    kvfs = KVFS(
        engine.num_pages,
        engine.block_size,
        engine.page_bytes,
        engine,
        store_from_location(config.kv_store_dir),
        host_pages=config.host_pages,
        limits=KVFSLimits(
            max_pinned_fraction=config.kv_pinned_fraction, account_reserve_fraction=config.kv_account_reserve
        ),
        on_release=releases.add,
        worker_id=config.name,
        prefix_cache=config.prefix_cache,
        lazy_write_s=config.kv_lazy_write_s,
    )
    loaded = kvfs.load_index()
    kvfs.limits = dataclasses.replace(kvfs.limits, store_bytes=kvfs.store_capacity(config.kv_store_bytes))
    # Each forward into the staff's engine timeline, and over OTLP when the environment says so.
    timeline = EngineTimeline(sink=engine_otel.from_env(config.name))
    scheduler = Scheduler(
        engine,
        kvfs,
        sched,
        config.max_model_len,
        engine_thread=engine_thread,
        releases=releases,
        active_sessions=sessions.active_ids,
        timeline=timeline,
    )
    scheduler.start()
    events = EventPublisher(config.redis_url, config.stream_budget)
    if engine.vocab_size != grammar.vocab_size:  # the checkpoint's config.json said otherwise
        log.warning("event=grammar_vocab_mismatch config=%d engine=%d", grammar.vocab_size, engine.vocab_size)
        await asyncio.gather(grammar_started, return_exceptions=True)
        await grammar.close()
        grammar = GrammarCompiler(config.model_dir, engine.vocab_size, config.grammar)
    worker = Worker(config, engine, Tokenizer(config.model_dir), kvfs, scheduler, events, sessions, grammar)
    log.info("event=kv_index_loaded files=%d store=%s", loaded, config.kv_store_dir)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await worker.start()
    beacon.ready()
    log.info("event=config %s", " ".join(f"{k}={v}" for k, v in dataclasses.asdict(config).items()))
    await stop.wait()
    log.info("event=shutdown_requested")
    await worker.shutdown()  # stops the scheduler: its loop gives the engine thread back
    await asyncio.wrap_future(engine_thread.submit(engine.close))


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "health":
        return health(args)
    from gpu_worker import logs

    logs.setup(args.log_level, args.name)
    asyncio.run(serve(build_config(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
