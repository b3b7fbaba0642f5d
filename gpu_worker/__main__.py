"""``python -m gpu_worker`` runs a worker; ``python -m gpu_worker health`` probes one (exit 0/1)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import signal
import sys

from gpu_worker.config import SchedulerConfig, WorkerConfig, env_defaults

log = logging.getLogger("gpu_worker")


def _slack(value: str) -> int | None:
    """``--contended-prefill-slack``: a token count >= 0, or ``off`` for no bound."""
    if value.lower() == "off":
        return None
    tokens = int(value)
    if tokens < 0:
        raise argparse.ArgumentTypeError("must be >= 0 or 'off'")
    return tokens


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
    p.add_argument("--dtype", default="auto")
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
        type=_slack,
        default=SchedulerConfig.contended_prefill_slack,
        help="tokens a contended prefill chunk may take its tenant above those left out ('off': no bound)",
    )
    p.add_argument("--redis-url", default=env["redis_url"])
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
        sessions_dir=str(args.sessions_dir),
        kv_store_dir=str(args.kv_store),
        name=args.name,
        kv_cache_gib=args.kv_cache_gib,
        num_pages=args.num_pages,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        host_pages=args.host_pages,
        redis_url=args.redis_url,
        scheduler=SchedulerConfig(
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_num_seqs=args.max_num_seqs,
            max_batch_wait_s=args.max_batch_wait_ms / 1000,
            batch_wait_fraction=args.batch_wait_fraction,
            io_swap_threshold_s=args.io_swap_threshold_s,
            contended_prefill_slack=args.contended_prefill_slack,
        ),
    )


async def serve(config: WorkerConfig) -> None:
    from gpu_worker.engine import Engine, EngineConfig
    from gpu_worker.events import EventPublisher
    from gpu_worker.kvfs import KVFS, store_from_location
    from gpu_worker.scheduler import EngineThread, Scheduler
    from gpu_worker.server import Worker
    from gpu_worker.tokenizer import Tokenizer

    sched = config.scheduler
    # The engine is built on the thread that will run every forward (the scheduler's loop):
    # vLLM's CPU backend sets up its threads for the thread that builds it, and forwards from
    # another thread ran 20-25% slower (bench/RESULTS.md, B3).
    engine_thread = EngineThread()
    engine = await asyncio.wrap_future(
        engine_thread.submit(
            Engine,
            EngineConfig(
                model_dir=config.model_dir,
                dtype=config.dtype,
                num_pages=config.num_pages,
                kv_cache_gib=config.kv_cache_gib,
                # Room for one call whose pending tokens (after merge/reload) exceed the budget.
                max_num_batched_tokens=sched.max_num_batched_tokens + config.max_model_len,
                max_num_seqs=sched.max_num_seqs,
                max_model_len=config.max_model_len,
            ),
        )
    )
    scheduler_ref: list[Scheduler] = []
    kvfs = KVFS(
        engine.num_pages,
        engine.block_size,
        engine.page_bytes,
        engine,
        store_from_location(config.kv_store_dir),
        host_pages=config.host_pages,
        on_release=lambda seq_id: scheduler_ref[0].defer_release(seq_id),
    )
    loaded = kvfs.load_index()
    scheduler = Scheduler(engine, kvfs, sched, config.max_model_len, engine_thread=engine_thread)
    scheduler_ref.append(scheduler)
    scheduler.start()
    worker = Worker(config, engine, Tokenizer(config.model_dir), kvfs, scheduler, EventPublisher(config.redis_url))
    log.info("event=kv_index_loaded files=%d store=%s", loaded, config.kv_store_dir)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await worker.start()
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
