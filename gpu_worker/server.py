"""The worker process: admin socket, one socket per session, and their lifecycles.

The asyncio loop does all socket I/O and brokered I/O; KVFS calls run on a small thread pool;
forwards run on the scheduler's engine thread. A connection's faults (bad frames, hostile
arguments, a crash in a handler) end in an error reply or in closing that connection only.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import hmac
import logging
import os
import secrets
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

from gpu_worker import admin, lip_ops, protocol
from gpu_worker.config import WorkerConfig
from gpu_worker.engine import set_cpu_threads_of_this_thread
from gpu_worker.events import EventPublisher
from gpu_worker.grammar import GrammarCompiler
from gpu_worker.kvfs import KVFS, KVFSError
from gpu_worker.pred_relay import PredRelay, error_reply
from gpu_worker.protocol import ErrorCode, ProtocolError
from gpu_worker.scheduler import Scheduler
from gpu_worker.sessions import Session, SessionLimits

log = logging.getLogger(__name__)

#: Sessions left behind by a control plane that never called end_session are reaped this long
#: after their deadline.
REAP_GRACE_S = 300.0
#: Seconds between Redis heartbeats (their keys expire after events.HEARTBEAT_TTL_S).
HEARTBEAT_EVERY_S = 2.0


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
    ) -> None:
        self.config = config
        self.engine = engine
        self.tokenizer = tokenizer
        self.kvfs = kvfs
        self.scheduler = scheduler
        self.events = events
        self.vocab_size: int = engine.vocab_size
        self.block_size: int = engine.block_size
        self.device: str = getattr(engine, "device", "cpu")
        self.grammar = GrammarCompiler(config.model_dir, self.vocab_size)
        self.sessions: dict[str, Session] = {}
        # The loop and its pools run per-token ops on one vocabulary row at a time: one CPU
        # thread each, so they never wait at a barrier for a thread the forward displaced.
        one_thread = partial(set_cpu_threads_of_this_thread, 1)
        self._kv_pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="kvfs", initializer=one_thread)
        self._io_pool = concurrent.futures.ThreadPoolExecutor(8, thread_name_prefix="io", initializer=one_thread)
        self._admin_server: asyncio.AbstractServer | None = None
        self._ticker: asyncio.Task | None = None
        self._closing = False
        scheduler.active_sessions = self._active_sessions

    # ----------------------------------------------------------------------- helpers
    async def kv(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run a KVFS call off the loop; its errors become protocol errors."""
        try:
            return await asyncio.get_running_loop().run_in_executor(self._kv_pool, partial(fn, *args))
        except KVFSError as exc:
            raise ProtocolError(exc.code, exc.message) from None

    async def in_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._io_pool, partial(fn, *args))

    async def blocked_on_io(self, s: Session, aw: Awaitable[Any]) -> Any:
        """Await brokered I/O; past the threshold the session's private pages go to host memory."""
        s.io_waits += 1
        loop = asyncio.get_running_loop()
        timer = loop.call_later(self.config.scheduler.io_swap_threshold_s, lambda: loop.create_task(self._swap_out(s)))
        try:
            return await aw
        finally:
            s.io_waits -= 1
            timer.cancel()

    async def _swap_out(self, s: Session) -> None:
        if s.io_waits == 0 or s.ended or s.swapped:
            return
        try:
            freed = await asyncio.wrap_future(self.scheduler.run_on_engine(partial(self.kvfs.swap_out, s.owner)))
        except KVFSError as exc:
            log.warning("event=swap_out_failed session=%s tenant=%s error=%s", s.session_id, s.tenant, exc.message)
            return
        s.swapped = True
        s.swaps += 1
        log.info("event=swap_out session=%s tenant=%s run=%s pages=%d", s.session_id, s.tenant, s.run_id, freed)

    def _active_sessions(self) -> list[str]:
        return [s.session_id for s in list(self.sessions.values()) if s.writers and s.io_waits == 0 and not s.ended]

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
            "block_size": self.block_size,
            "pages_total": st.total_pages,
            "pages_free": st.free_pages,
            "host_pages": st.host_pages,
            "disk_pages": st.disk_pages,
            "sessions": len(self.sessions),
            "events_dropped": self.events.dropped,
            "metrics": self.scheduler.snapshot(),
        }

    def stats(self) -> dict[str, Any]:
        return {
            "name": self.config.name,
            "scheduler": self.scheduler.snapshot(),
            "kvfs": dataclasses.asdict(self.kvfs.stats()),
            "engine": self.engine.stats() if hasattr(self.engine, "stats") else {},
            "events": {"published": self.events.published, "dropped": self.events.dropped},
            "grammar": {"compiled": self.grammar.compiled, "cache_hits": self.grammar.hits},
            "sessions": [
                {
                    "session_id": s.session_id,
                    "tenant": s.tenant,
                    "run_id": s.run_id,
                    "connected": bool(s.writers),
                    "swaps": s.swaps,
                    "usage": s.usage.to_dict(),
                }
                for s in list(self.sessions.values())
            ],
        }

    # --------------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        set_cpu_threads_of_this_thread(1)  # the event loop's thread (see __init__)
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
        for sid in list(self.sessions):
            await self.end_session(sid)
        self.scheduler.stop()
        await self.kv(self.kvfs.flush)
        Path(self.config.admin_socket).unlink(missing_ok=True)
        self.events.close()
        log.info("event=worker_stopped name=%s", self.config.name)

    async def _tick(self) -> None:
        """Live ``kv`` events, page-second metering and reaping of abandoned sessions."""
        interval = self.config.kv_event_interval_s
        last: dict[str, tuple[dict[str, int], float]] = {}
        next_heartbeat = 0.0
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            if now >= next_heartbeat:
                self.events.heartbeat(self.config.name, {**self.health(), "at": time.time()})
                next_heartbeat = now + HEARTBEAT_EVERY_S
            live = []
            for s in list(self.sessions.values()):
                if s.ended:
                    continue
                if s.deadline is not None and now > s.deadline + REAP_GRACE_S:
                    log.warning("event=session_reaped session=%s tenant=%s run=%s", s.session_id, s.tenant, s.run_id)
                    await self.end_session(s.session_id)
                    continue
                live.append(s)
            # One KVFS call for all sessions: per session it cost two thread hops on the loop
            # that also relays every pred, twice a second (~10 ms a tick with 32 sessions).
            usage = await self.kv(self.kvfs.live_usage, [s.owner for s in live])
            for s, (snap, pages) in zip(live, usage, strict=True):
                if s.ended:  # ended while the usage was read
                    continue
                s.usage.sample_pages(pages, now)
                prev = last.get(s.session_id)
                if s.writers and (prev is None or prev[0] != snap or now - prev[1] > 5.0):
                    self.events.publish(s.run_id, "kv", snap)
                    last[s.session_id] = (snap, now)
            for sid in [k for k in last if k not in self.sessions]:
                del last[sid]

    # ---------------------------------------------------------------------- sessions
    async def create_session(self, tenant: str, run_id: str, limits: object) -> Session:
        if self._closing:
            raise ProtocolError(ErrorCode.BUSY, "worker is shutting down")
        parsed = SessionLimits.parse(limits)
        if len(self.sessions) >= self.config.max_sessions:
            raise ProtocolError(
                ErrorCode.BUSY, f"worker has {len(self.sessions)} sessions (limit {self.config.max_sessions})"
            )
        st = self.kvfs.stats()
        cap = parsed.page_cap(self.kvfs.page_bytes)
        if cap is not None and cap < 1:
            raise ProtocolError(ErrorCode.BAD_ARGS, "limits allow no KV page at all")
        if st.free_pages == 0 and st.host_pages - st.host_clean_pages >= st.host_capacity_pages:
            raise ProtocolError(ErrorCode.NO_SPACE, "no free KV pages on this worker; retry later")
        sid = "s-" + secrets.token_hex(8)
        path = str(Path(self.config.sessions_dir) / f"{sid}.sock")
        s = Session(sid, tenant, run_id, parsed, path, self.config.max_dists_per_session)
        await self.kv(self.kvfs.set_session_limit, s.owner, cap)
        if parsed.max_stored_bytes is not None:
            await self.kv(self.kvfs.set_tenant_stored_limit, tenant, parsed.max_stored_bytes)
        s.server = await asyncio.start_unix_server(partial(self._serve, s), path=path, limit=protocol.MAX_FRAME_BYTES)
        # The sandbox's non-root user connects through the bind mount; the token guards it.
        os.chmod(path, 0o666)  # noqa: S103
        self.sessions[sid] = s
        log.info(
            "event=session_created session=%s tenant=%s run=%s max_tokens=%s max_pages=%s deadline_s=%s",
            sid,
            tenant,
            run_id,
            parsed.max_tokens,
            cap,
            parsed.deadline_s,
        )
        return s

    async def end_session(self, session_id: str) -> dict[str, Any]:
        s = self.sessions.get(session_id)
        if s is None:
            raise ProtocolError(ErrorCode.NOT_FOUND, f"no such session {session_id}")
        del self.sessions[session_id]
        s.ended = True
        if s.server is not None:
            s.server.close()
        for writer in list(s.writers):
            writer.close()
        for task in list(s.tasks):
            task.cancel()
        self.scheduler.cancel_session(session_id)
        deadline = time.monotonic() + 60
        while self.scheduler.session_busy(session_id) and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        await self._publish_final_kv(s)
        try:
            await self.kv(self.kvfs.close_session, s.owner)
        except ProtocolError as exc:
            log.error("event=close_session_failed session=%s error=%s", session_id, exc)
        s.usage.sample_pages(0)
        s.dists.clear()
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
        return {"usage": usage, "result": s.result, "error": s.error}

    async def _publish_final_kv(self, s: Session) -> None:
        """The KV the run held at its end, as one last ``kv`` event: the tick samples twice a
        second, so a run shorter than that would otherwise show no KV usage at all."""
        if not s.run_id:
            return
        try:
            ((snap, _pages),) = await self.kv(self.kvfs.live_usage, [s.owner])
        except ProtocolError as exc:
            log.warning("event=final_kv_unread session=%s error=%s", s.session_id, exc)
            return
        if snap["tokens"]:
            self.events.publish(s.run_id, "kv", snap)

    # -------------------------------------------------------------------- connections
    async def _serve(self, session: Session | None, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection: admin (``session is None``) or a LIP's session connection."""
        authenticated = session is None
        inflight: set[asyncio.Task] = set()
        preds: PredRelay | None = None
        if session is not None:
            if session.ended:
                writer.close()
                return
            session.writers.add(writer)
            preds = PredRelay(self, session, writer, self._send)
        try:
            while True:
                try:
                    header = await reader.readexactly(protocol.HEADER_BYTES)
                    length = protocol.frame_length(header)
                    body = await reader.readexactly(length)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                except ProtocolError as exc:
                    self._send(writer, protocol.err_reply(None, exc))
                    return  # a bad length prefix desynchronises the stream: close
                try:
                    req_id, op, args = protocol.parse_request(protocol.unpack_body(body))
                except ProtocolError as exc:
                    if not authenticated:
                        return
                    self._send(writer, protocol.err_reply(None, exc))
                    continue
                if not authenticated:
                    if op != "hello" or not self._hello_ok(session, args):
                        log.warning("event=auth_failed session=%s op=%s", session.session_id, op[:32])
                        self._send(
                            writer,
                            protocol.err_reply(
                                req_id, ProtocolError(ErrorCode.NOT_AUTHENTICATED, "hello with the session token first")
                            ),
                        )
                        return
                    authenticated = True
                    self._send(writer, protocol.ok_reply(req_id, self._hello_reply(session)))
                    continue
                if len(inflight) + (len(preds) if preds is not None else 0) >= protocol.MAX_IN_FLIGHT:
                    self._send(
                        writer, protocol.err_reply(req_id, ProtocolError(ErrorCode.BUSY, "too many requests in flight"))
                    )
                    continue
                if op == "pred" and preds is not None:
                    preds.start(req_id, args)
                    continue
                task = asyncio.get_running_loop().create_task(self._dispatch(session, writer, req_id, op, args))
                inflight.add(task)
                task.add_done_callback(inflight.discard)
                if session is not None:
                    session.tasks.add(task)
                    task.add_done_callback(session.tasks.discard)
        except Exception:
            log.exception("event=connection_error session=%s", getattr(session, "session_id", "admin"))
        finally:
            for task in inflight:
                task.cancel()
            if preds is not None:
                preds.abandon_all()
            if session is not None:
                session.writers.discard(writer)
            writer.close()

    def _hello_ok(self, session: Session, args: dict[str, Any]) -> bool:
        token = args.get("token")
        return isinstance(token, str) and hmac.compare_digest(token.encode(), session.token.encode())

    def _hello_reply(self, s: Session) -> dict[str, Any]:
        return {
            "session_id": s.session_id,
            "tenant": s.tenant,
            "run_id": s.run_id,
            "vocab_size": self.vocab_size,
            "eos_token_ids": self.tokenizer.eos_token_ids,
            "block_size": self.block_size,
            "protocol_version": protocol.PROTOCOL_VERSION,
        }

    async def _dispatch(
        self, s: Session | None, writer: asyncio.StreamWriter, req_id: int, op: str, args: dict[str, Any]
    ) -> None:
        try:
            if s is None:
                handler = admin.HANDLERS.get(op)
                if handler is None:
                    raise ProtocolError(ErrorCode.UNKNOWN_OP, f"unknown admin op {op[:64]!r}")
                value = await handler(self, args)
            else:
                handler = lip_ops.HANDLERS.get(op)
                if handler is None:
                    raise ProtocolError(ErrorCode.UNKNOWN_OP, f"unknown op {op[:64]!r}")
                if s.ended:
                    raise ProtocolError(ErrorCode.TIMEOUT, "session ended")
                value = await handler(self, s, args)
            reply = protocol.ok_reply(req_id, value)
        except asyncio.CancelledError:
            return
        except Exception as exc:
            reply = protocol.err_reply(req_id, error_reply(exc, op, getattr(s, "session_id", "admin")))
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
