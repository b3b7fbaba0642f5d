"""The worker process: admin socket, one socket per session, and their lifecycles.

The asyncio loop does all socket I/O and brokered I/O; KVFS calls run on a small thread pool;
forwards run on the scheduler's engine thread. A connection's faults (bad frames, hostile
arguments, a crash in a handler) end in an error reply or in closing that connection only.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import logging
import os
import secrets
import time
from functools import partial
from pathlib import Path
from typing import Any

from gpu_worker import ops, protocol, run_files, tracing
from gpu_worker.config import WorkerConfig
from gpu_worker.connections import READ_BUFFER_BYTES, ConnectionGuard, close_with, raise_open_file_limit
from gpu_worker.contracts import KvEvent
from gpu_worker.engine import set_cpu_threads_of_this_thread
from gpu_worker.events import EventPublisher
from gpu_worker.grammar import GrammarCompiler
from gpu_worker.kvfs import KVFS, KVFSError
from gpu_worker.ops.context import OpContext
from gpu_worker.ops.errors import wire_error
from gpu_worker.ops.pred import PredRelay
from gpu_worker.protocol import ErrorCode, ProtocolError
from gpu_worker.refusal_pacing import RefusalPacer
from gpu_worker.scheduler import Scheduler
from gpu_worker.sessions import SessionLimits, SessionTable, WorkerSession

log = logging.getLogger(__name__)

#: Sessions left behind by a control plane that never called end_session are reaped this long
#: after their deadline.
REAP_GRACE_S = 300.0
#: Seconds between Redis heartbeats (their keys expire after contracts.HEARTBEAT_TTL_S).
HEARTBEAT_EVERY_S = 2.0
#: Seconds between sweeps for run-scoped KV files of ended trees (``run_files.sweep``).
RUN_FILE_SWEEP_EVERY_S = 60.0


class Worker:
    """Wires engine, KVFS, scheduler and events to the admin and session sockets."""

    def __init__(
        self,
        config: WorkerConfig,
        engine: Any,
        tokenizer: Any,
        kvfs: KVFS,
        scheduler: Scheduler,
        events: EventPublisher,
        sessions: SessionTable,
        grammar: GrammarCompiler | None = None,
    ) -> None:
        """``sessions``: the table the scheduler was given too (``Scheduler(active_sessions=
        sessions.active_ids)``), filled and emptied here. ``grammar``: a compiler whose start the
        caller may already have begun (default: one started by :meth:`start`)."""
        self.config = config
        self.engine = engine
        self.tokenizer = tokenizer
        self.kvfs = kvfs
        self.scheduler = scheduler
        self.events = events
        self.vocab_size: int = engine.vocab_size
        self.block_size: int = engine.block_size
        self.device: str = getattr(engine, "device", "cpu")
        self.dtype: str = getattr(engine, "dtype", "")
        self.grammar = grammar or GrammarCompiler(config.model_dir, self.vocab_size, config.grammar)
        self.sessions = sessions
        #: All a LIP's op handlers get of the worker (and the pools KVFS calls run on).
        self.context = OpContext(config, self.vocab_size, tokenizer, kvfs, scheduler, events, self.grammar)
        self._admin_server: asyncio.AbstractServer | None = None
        self._ticker: asyncio.Task | None = None
        self.guard = ConnectionGuard(config.conn)
        #: Holds the replies of an account's repeated refusals (gpu_worker/refusal_pacing.py).
        self.pacer = RefusalPacer()
        self._watchdog: asyncio.Task | None = None
        self._closing = False

    # ----------------------------------------------------------------------- helpers
    async def kv(self, fn: Any, *args: Any) -> Any:
        """A KVFS call off the loop (``OpContext.kv``)."""
        return await self.context.kv(fn, *args)

    def scheduler_alive(self) -> bool:
        return self.scheduler.alive()

    def health(self) -> dict[str, Any]:
        """What ``health`` answers and the Redis heartbeat carries (routing input)."""
        st = self.kvfs.stats()
        return {
            "ok": self.scheduler_alive(),
            "name": self.config.name,
            "model": self.config.model_dir,
            "device": self.device,
            "dtype": self.dtype,
            # Compiled (vLLM's torch.compile) or eager: a benchmark gives its baseline the same.
            "compiled": bool(getattr(self.engine, "compiled", False)),
            "block_size": self.block_size,
            "pages_total": st.total_pages,
            # Pages only the prefix cache holds are reclaimed before anything else: as free as free
            # pages for routing and admission (shown apart as ``pages_prefix_cached``).
            "pages_free": st.free_pages + st.prefix_cached_pages,
            "pages_prefix_cached": st.prefix_cached_pages,
            "host_pages": st.host_pages,
            "disk_pages": st.disk_pages,
            # The KV store's pool (``PoolName.KV_STORE_BYTES``) for ``check --deploy``; None: unmeasured.
            "kv_store_bytes": self.kvfs.limits.store_bytes,
            "sessions": len(self.sessions),
            "trace": self.config.trace,
            "events_dropped": self.events.dropped,
            "metrics": self.scheduler.snapshot(),
        }

    def engine_timeline(self, limit: int | None = None) -> protocol.EngineTimelineReply:
        """The engine's last forwards (``engine_timeline``; gpu_worker/engine_timeline.py)."""
        return self.scheduler.timeline.snapshot(limit)

    def stats(self) -> dict[str, Any]:
        return {
            "name": self.config.name,
            "scheduler": self.scheduler.snapshot(),
            "kvfs": dataclasses.asdict(self.kvfs.stats()),
            "engine": self.engine.stats() if hasattr(self.engine, "stats") else {},
            "events": {
                "published": self.events.published,
                "dropped": self.events.dropped,
                "refused": self.events.refused,
                "redis_bytes_capacity": None if self.events.pool is None else self.events.pool.capacity,
            },
            "grammar": self.grammar.stats(),
            # Refusals whose replies were held (gpu_worker/refusal_pacing.py).
            "refusals_paced": self.pacer.stats(),
            "channels": self.context.channels.stats(),
            "connections": self.guard.stats(),
            "sessions": [
                {
                    "session_id": s.session_id,
                    "tenant": s.tenant,
                    "run_id": s.run_id,
                    "connected": bool(s.conns),
                    "swaps": s.swaps,
                    "usage": s.usage.to_dict(),
                }
                for s in list(self.sessions.values())
            ],
        }

    # --------------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        set_cpu_threads_of_this_thread(1)  # the event loop's thread (see __init__)
        raise_open_file_limit(self.config.conn)
        await self.grammar.start()  # before any session can ask for a grammar
        sessions_dir = Path(self.config.sessions_dir)
        sessions_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(sessions_dir, 0o700)
        admin_path = Path(self.config.admin_socket)
        admin_path.parent.mkdir(parents=True, exist_ok=True)
        admin_path.unlink(missing_ok=True)
        self._admin_server = await asyncio.start_unix_server(
            partial(self._serve, None), path=str(admin_path), limit=protocol.MAX_FRAME_BYTES
        )
        os.chmod(admin_path, 0o600)
        self._ticker = asyncio.get_running_loop().create_task(self._tick())
        self._watchdog = asyncio.get_running_loop().create_task(self.guard.watch())
        log.info(
            "event=worker_ready name=%s admin_socket=%s sessions_dir=%s", self.config.name, admin_path, sessions_dir
        )

    async def shutdown(self) -> None:
        """End every session, flush persistent KV files, stop the engine thread."""
        self._closing = True
        if self._admin_server is not None:
            self._admin_server.close()
        if self._ticker is not None:
            self._ticker.cancel()
        if self._watchdog is not None:
            self._watchdog.cancel()
        for sid in list(self.sessions):
            await self.end_session(sid)
        self.scheduler.stop()
        sink = self.scheduler.timeline.sink
        if sink is not None and hasattr(sink, "shutdown"):  # the OTLP exporter sends what it holds
            await asyncio.to_thread(sink.shutdown)
        await self.grammar.close()
        await self.kv(self.kvfs.flush)
        Path(self.config.admin_socket).unlink(missing_ok=True)
        self.events.close()
        log.info("event=worker_stopped name=%s", self.config.name)

    async def _tick(self) -> None:
        """Live ``kv`` events, page-second metering and reaping of abandoned sessions."""
        interval = self.config.kv_event_interval_s
        last: dict[str, tuple[dict[str, int], float]] = {}
        checkpoints: dict[str, tuple[dict[str, float | int], float]] = {}
        next_heartbeat = 0.0
        next_sweep = 0.0  # at once: files of trees that ended while this worker was down
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            if now >= next_heartbeat:
                self.events.heartbeat(self.config.name, {**self.health(), "at": time.time()})
                next_heartbeat = now + HEARTBEAT_EVERY_S
            if now >= next_sweep:
                next_sweep = now + RUN_FILE_SWEEP_EVERY_S
                await self._sweep_run_files()
            live = []
            for s in list(self.sessions.values()):
                if s.ended:
                    continue
                if s.deadline is not None and now > s.deadline + REAP_GRACE_S:
                    log.warning("event=session_reaped session=%s tenant=%s run=%s", s.session_id, s.tenant, s.run_id)
                    await self.end_session(s.session_id)
                    continue
                live.append(s)
            # One KVFS call for all sessions: one per session would cost two thread hops each on
            # the loop that also relays every pred, twice a second (~10 ms a tick with 32 sessions).
            usage = await self.kv(self.kvfs.live_usage, [s.owner for s in live])
            await self.kv(self.kvfs.renew_leases)  # write leases on the shared store (kvfs/lease.py)
            await self.kv(self.kvfs.write_idle)  # durable=False files idle long enough
            for s, (snap, pages) in zip(live, usage, strict=True):
                if s.ended:  # ended while the usage was read
                    continue
                s.usage.sample_pages(pages, now)
                self._checkpoint_usage(s, now, checkpoints)
                prev = last.get(s.session_id)
                if s.conns and (prev is None or prev[0] != snap or now - prev[1] > 5.0):
                    self.events.publish(s.run_id, s.account, KvEvent(**snap))
                    last[s.session_id] = (snap, now)
            for sid in [k for k in last if k not in self.sessions]:
                del last[sid]
            for sid in [k for k in checkpoints if k not in self.sessions]:
                del checkpoints[sid]

    async def _sweep_run_files(self) -> None:
        """Remove run-scoped KV files of trees that ended without this worker seeing their last
        session end (a lost worker's, found at restart or in a shared store)."""
        live = {(s.tenant, s.tree) for s in self.sessions.values() if not s.ended}
        try:
            await run_files.sweep(self.kv, self.kvfs, self.context.redis(), live)
        except Exception as exc:  # Redis or the store unreachable: the next sweep tries again
            log.warning("event=run_file_sweep_failed error=%r", exc)

    # ---------------------------------------------------------------------- sessions
    async def create_session(
        self,
        tenant: str,
        run_id: str,
        limits: object,
        tree: str | None = None,
        trace: protocol.TraceContext | None = None,
    ) -> WorkerSession:
        """``tree``: the run tree (root run id) whose channels the session shares; default its own.
        ``trace``: the run's trace context, which the forwards it rides carry (engine_otel)."""
        if self._closing:
            raise ProtocolError(ErrorCode.BUSY, "worker is shutting down")
        parsed = SessionLimits.parse(limits)
        if len(self.sessions) >= self.config.max_sessions:
            raise ProtocolError(
                ErrorCode.BUSY, f"worker has {len(self.sessions)} sessions (limit {self.config.max_sessions})"
            )
        st = self.kvfs.stats()
        # Never above what one account may hold of the pool (gpu_worker/kvfs/accounts.py).
        cap = self.kvfs.shares.pool.clamp(parsed.page_cap(self.kvfs.page_bytes))
        if cap < 1:
            raise ProtocolError(ErrorCode.BAD_ARGS, "limits allow no KV page at all")
        # Idle unpinned named files are spilled for the new run, so they count as room.
        if (
            st.host_pages - st.host_clean_pages >= st.host_capacity_pages
            and await self.kv(self.kvfs.reclaimable_pages) == 0
        ):
            raise ProtocolError(ErrorCode.NO_SPACE, "no free KV pages on this worker; retry later")
        sid = "s-" + secrets.token_hex(8)
        path = str(Path(self.config.sessions_dir) / f"{sid}.sock")
        s = WorkerSession(
            sid,
            tenant,
            run_id,
            parsed,
            path,
            self.config.max_dists_per_session,
            tree=tree or "",
            trace=tracing.SessionTrace(self.config.trace, context=trace),
        )
        await self.kv(partial(self.kvfs.set_session_limit, account=s.account, weight=parsed.weight), s.owner, cap)
        await self.kv(self.kvfs.set_tenant_quota, tenant, parsed.quota)
        s.server = await asyncio.start_unix_server(partial(self._serve, s), path=path, limit=READ_BUFFER_BYTES)
        # The sandbox's non-root user connects through the bind mount; the token guards it.
        os.chmod(path, 0o666)  # noqa: S103
        self.sessions[sid] = s
        self.context.channels.join(s)
        log.info(
            "event=session_created session=%s tenant=%s run=%s tree=%s max_tokens=%s max_pages=%s deadline_s=%s",
            sid,
            tenant,
            run_id,
            s.tree,
            parsed.max_tokens,
            cap,
            parsed.deadline_s,
        )
        return s

    async def end_session(self, session_id: str) -> protocol.SessionEnded:
        s = self.sessions.get(session_id)
        if s is None:
            raise ProtocolError(ErrorCode.NOT_FOUND, f"no such session {session_id}")
        del self.sessions[session_id]
        s.ended = True
        last_of_tree = self.context.channels.others_in_tree(s) == 0
        self.context.channels.leave(session_id)  # the tree's last session frees its channels
        if s.server is not None:
            s.server.close()
        for conn in list(s.conns):
            self.guard.forget(conn)
            conn.writer.transport.abort()  # unsent replies are moot; a peer that reads none keeps no fd
        for task in list(s.tasks):
            task.cancel()
        self.scheduler.cancel_session(session_id)
        deadline = time.monotonic() + 60
        while self.scheduler.session_busy(session_id) and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        await self._publish_final_kv(s)
        try:
            await self.kv(self.kvfs.close_session, s.owner)
        except KVFSError as exc:
            log.error("event=close_session_failed session=%s error=%s", session_id, exc)
        if last_of_tree:  # the tree ended here: its run-scoped files go with it
            try:
                await self.kv(run_files.remove_tree, self.kvfs, s.tenant, s.tree)
            except Exception as exc:  # the sweep on the tick tries again
                log.error("event=run_files_remove_failed tree=%s error=%r", s.tree, exc)
        s.usage.sample_pages(0)
        s.dists.clear()
        s.biases.clear()
        Path(s.socket_path).unlink(missing_ok=True)
        usage = s.usage.to_dict()
        log.info(
            "event=session_ended session=%s tenant=%s run=%s finished=%s %s",
            session_id,
            s.tenant,
            s.run_id,
            s.finished,
            " ".join(f"{k}={v}" for k, v in usage.items()),
        )
        return protocol.SessionEnded(usage=usage, result=s.result, error=s.error, trace=dict(s.trace.to_wire()))

    def _checkpoint_usage(
        self, s: WorkerSession, now: float, checkpoints: dict[str, tuple[dict[str, float | int], float]]
    ) -> None:
        """The session's usage so far, kept in Redis (contracts: usage checkpoints) when its
        tokens or calls changed, or every 5 s for its page-seconds: billed if the run's
        executor or this worker dies before the session's end."""
        if not s.run_id:
            return
        usage = s.usage.to_dict()
        counted = {k: v for k, v in usage.items() if k != "page_seconds"}
        prev = checkpoints.get(s.session_id)
        if prev is not None and prev[0] == counted and now - prev[1] <= 5.0:
            return
        self.events.usage_checkpoint(s.run_id, usage)
        checkpoints[s.session_id] = (counted, now)

    async def _publish_final_kv(self, s: WorkerSession) -> None:
        """The KV the run held at its end, as one last ``kv`` event: the tick samples twice a
        second, so a run shorter than that would otherwise show no KV usage at all."""
        if not s.run_id:
            return
        try:
            ((snap, _pages),) = await self.kv(self.kvfs.live_usage, [s.owner])
        except KVFSError as exc:
            log.warning("event=final_kv_unread session=%s error=%s", s.session_id, exc)
            return
        if snap["tokens"]:
            self.events.publish(s.run_id, s.account, KvEvent(**snap))

    # -------------------------------------------------------------------- connections
    async def _serve(
        self, session: WorkerSession | None, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """One connection: admin (``session is None``) or a LIP's session connection, read only
        while its unsent replies are under the bound (``connections``)."""
        if session is None:
            await self._serve_admin(reader, writer)
            return
        if session.ended:
            writer.transport.abort()
            return
        conn = self.guard.admit(session, writer)
        if conn is None:
            return
        inflight: set[asyncio.Task] = set()
        preds = PredRelay(self.context, session, writer, self._send, self.pacer)
        max_unsent = self.config.conn.max_unsent_reply_bytes
        try:
            while True:
                try:
                    if writer.transport.get_write_buffer_size() > max_unsent:
                        await writer.drain()  # back-pressure: see connections.apply_back_pressure_limits
                    body = await self.guard.read_frame(conn, reader)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                except ProtocolError as exc:
                    close_with(writer, exc)
                    return  # the frame's body is not read: the stream is out of step, close
                try:
                    req_id, op, args = protocol.parse_request(protocol.unpack_body(body))
                except ProtocolError as exc:
                    if not conn.authenticated:
                        return
                    self._send(writer, protocol.err_reply(protocol.request_id_of(body), exc))
                    continue
                if not conn.authenticated:
                    if op != protocol.Hello.OP or not self._hello_ok(session, args):
                        log.warning("event=auth_failed session=%s op=%s", session.session_id, op[:32])
                        error = ProtocolError(ErrorCode.NOT_AUTHENTICATED, "hello with the session token first")
                        self._send(writer, protocol.err_reply(req_id, error))
                        return
                    conn.authenticated = True
                    self._send(writer, protocol.ok_reply(req_id, self._hello_reply(session)))
                    continue
                if len(inflight) + len(preds) >= protocol.MAX_IN_FLIGHT:
                    error = ProtocolError(ErrorCode.BUSY, "too many requests in flight")
                    if hold := self.pacer.hold(session.account, error.code):
                        await asyncio.sleep(hold)  # the reader takes no request of this connection meanwhile
                    self._send(writer, protocol.err_reply(req_id, error))
                    continue
                if op == protocol.Pred.OP:  # the per-token call: no Task (ops/pred.py)
                    preds.start(req_id, args)
                    continue
                task = asyncio.get_running_loop().create_task(self._dispatch(session, writer, req_id, op, args))
                inflight.add(task)
                task.add_done_callback(inflight.discard)
                session.tasks.add(task)
                task.add_done_callback(session.tasks.discard)
        except Exception:
            log.exception("event=connection_error session=%s", session.session_id)
        finally:
            for task in inflight:
                task.cancel()
            preds.abandon_all()
            self.guard.forget(conn)
            if writer.transport.get_write_buffer_size() > 0:
                writer.transport.abort()  # no reply is coming for the cancelled calls anyway
            else:
                writer.close()

    async def _serve_admin(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """The control plane's connection (never mounted into a sandbox): no hello, no budgets."""
        inflight: set[asyncio.Task] = set()
        try:
            while True:
                try:
                    header = await reader.readexactly(protocol.HEADER_BYTES)
                    body = await reader.readexactly(protocol.frame_length(header))
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                except ProtocolError as exc:
                    close_with(writer, exc)
                    return
                try:
                    req_id, op, args = protocol.parse_request(protocol.unpack_body(body))
                except ProtocolError as exc:
                    self._send(writer, protocol.err_reply(protocol.request_id_of(body), exc))
                    continue
                if len(inflight) >= protocol.MAX_IN_FLIGHT:
                    error = ProtocolError(ErrorCode.BUSY, "too many requests in flight")
                    self._send(writer, protocol.err_reply(req_id, error))
                    continue
                task = asyncio.get_running_loop().create_task(self._dispatch(None, writer, req_id, op, args))
                inflight.add(task)
                task.add_done_callback(inflight.discard)
        except Exception:
            log.exception("event=connection_error session=admin")
        finally:
            for task in inflight:
                task.cancel()
            writer.close()

    def _hello_ok(self, session: WorkerSession, args: dict[str, Any]) -> bool:
        try:
            token = protocol.Hello.decode(args).token
        except ProtocolError:
            return False
        return hmac.compare_digest(token.encode(), session.token.encode())

    def _hello_reply(self, s: WorkerSession) -> protocol.HelloReply:
        return protocol.HelloReply(
            session_id=s.session_id,
            tenant=s.tenant,
            run_id=s.run_id,
            vocab_size=self.vocab_size,
            eos_token_ids=self.tokenizer.eos_token_ids,
            block_size=self.block_size,
            protocol_version=protocol.PROTOCOL_VERSION,
            # What one connection may have in flight before EBUSY (the SDK queues beyond it).
            max_in_flight=min(protocol.MAX_IN_FLIGHT, self.config.scheduler.max_inflight_preds_per_session),
        )

    async def _dispatch(
        self, s: WorkerSession | None, writer: asyncio.StreamWriter, req_id: int, op: str, args: dict[str, Any]
    ) -> None:
        try:
            if s is None:
                admin_handler = ops.ADMIN_HANDLERS.get(op)
                if admin_handler is None:
                    raise ProtocolError(ErrorCode.UNKNOWN_OP, f"unknown admin op {op[:64]!r}")
                value = await admin_handler(self, protocol.ADMIN_OPS[op].decode(args))
            else:
                handler = ops.LIP_HANDLERS.get(op)
                if handler is None:
                    raise ProtocolError(ErrorCode.UNKNOWN_OP, f"unknown op {op[:64]!r}")
                if s.ended:
                    raise ProtocolError(ErrorCode.TIMEOUT, "session ended")
                if not s.trace.enabled:
                    value = await handler(self.context, s, protocol.LIP_OPS[op].decode(args, self.vocab_size))
                else:
                    began = time.monotonic()
                    try:
                        value = await handler(self.context, s, protocol.LIP_OPS[op].decode(args, self.vocab_size))
                    finally:
                        s.trace.add(tracing.op_kind(op), op, began, time.monotonic())
            reply = protocol.ok_reply(req_id, value)
        except asyncio.CancelledError:
            return
        except Exception as exc:
            error = wire_error(exc, op, getattr(s, "session_id", "admin"))
            reply = protocol.err_reply(req_id, error)
            if s is not None and (hold := self.pacer.hold(s.account, error.code)):
                try:
                    await asyncio.sleep(hold)  # the request keeps its in-flight slot meanwhile
                except asyncio.CancelledError:
                    return
        self._send(writer, reply)

    @staticmethod
    def _send(writer: asyncio.StreamWriter, reply: dict[str, Any]) -> None:
        if writer.is_closing():
            return
        try:
            frame = protocol.pack(reply)
        except ProtocolError as exc:
            frame = protocol.pack(protocol.err_reply(reply.get("id"), exc))
        except (TypeError, ValueError) as exc:
            frame = protocol.pack(
                protocol.err_reply(reply.get("id"), ProtocolError(ErrorCode.INTERNAL, f"unencodable reply: {exc}"))
            )
        writer.write(frame)
