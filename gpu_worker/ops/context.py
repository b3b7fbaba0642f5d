"""What a LIP's op handlers may use of the worker: the model's vocabulary and tokenizer, KVFS,
the scheduler, the run event stream, the grammar compiler, and the thread pools their blocking
work runs on. Not the ``Worker``: no session table, no sockets, no lifecycle."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from gpu_worker.channels import ChannelBroker
from gpu_worker.config import WorkerConfig
from gpu_worker.engine import set_cpu_threads_of_this_thread
from gpu_worker.events import EventPublisher
from gpu_worker.grammar import GrammarCompiler
from gpu_worker.kvfs import KVFS, KVFSError
from gpu_worker.scheduler import Scheduler
from gpu_worker.sessions import WorkerSession

log = logging.getLogger(__name__)


class OpContext:
    def __init__(
        self,
        config: WorkerConfig,
        vocab_size: int,
        tokenizer: Any,
        kvfs: KVFS,
        scheduler: Scheduler,
        events: EventPublisher,
        grammar: GrammarCompiler,
    ) -> None:
        self.vocab_size = vocab_size
        self.tokenizer = tokenizer
        self.kvfs = kvfs
        self.scheduler = scheduler
        self.events = events
        self.grammar = grammar
        #: Channels between the runs of a tree (the worker joins and leaves sessions to it).
        self.channels = ChannelBroker(config.channel_bytes_per_tenant)
        self.max_inflight_preds = config.scheduler.max_inflight_preds_per_session
        self.http_timeout_s = config.http_timeout_s
        self.http_max_bytes = config.http_max_bytes
        self.io_swap_threshold_s = config.scheduler.io_swap_threshold_s
        #: Redis of the control plane: the process relay and child runs' event streams (ops/procs.py).
        self.redis_url = config.redis_url
        self._redis: Any = None
        # The loop and its pools run per-token ops on one vocabulary row at a time: one CPU
        # thread each, so they never wait at a barrier for a thread the forward displaced.
        one_thread = partial(set_cpu_threads_of_this_thread, 1)
        self._kv_pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="kvfs", initializer=one_thread)
        self._io_pool = concurrent.futures.ThreadPoolExecutor(8, thread_name_prefix="io", initializer=one_thread)

    def redis(self) -> Any:
        """The loop's asyncio Redis client, opened on first use (only runs that spawn need it)."""
        if self._redis is None:
            import redis.asyncio

            self._redis = redis.asyncio.Redis.from_url(self.redis_url, socket_connect_timeout=2)
        return self._redis

    async def kv(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run a KVFS call off the loop (it may move page data and wait for the engine lock);
        its ``KVFSError`` propagates, turned into a wire error by ``ops.errors``."""
        return await asyncio.get_running_loop().run_in_executor(self._kv_pool, partial(fn, *args))

    async def in_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._io_pool, partial(fn, *args))

    async def blocked_on_io(self, s: WorkerSession, aw: Awaitable[Any]) -> Any:
        """Await brokered I/O; past the threshold the session's private pages go to host memory."""
        s.io_waits += 1
        loop = asyncio.get_running_loop()
        timer = loop.call_later(self.io_swap_threshold_s, lambda: loop.create_task(self._swap_out(s)))
        try:
            return await aw
        finally:
            s.io_waits -= 1
            timer.cancel()

    async def _swap_out(self, s: WorkerSession) -> None:
        if s.io_waits == 0 or s.ended or s.swapped:
            return
        began = time.monotonic()
        try:
            freed = await asyncio.wrap_future(self.scheduler.run_on_engine(partial(self.kvfs.swap_out, s.owner)))
        except KVFSError as exc:
            log.warning("event=swap_out_failed session=%s tenant=%s error=%s", s.session_id, s.tenant, exc.message)
            return
        s.trace.kv_out(began, time.monotonic(), freed * self.kvfs.page_bytes)
        s.swapped = True
        s.swaps += 1
        log.info("event=swap_out session=%s tenant=%s run=%s pages=%d", s.session_id, s.tenant, s.run_id, freed)
