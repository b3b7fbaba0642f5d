"""``pred``, the call every generated token makes, from its frame to its reply, in one place.

The path of one call: the connection reads its frame and hands it to its :class:`PredRelay`
(``server.Worker._serve``); the relay decodes it (``protocol.Pred``) and :func:`admit` checks it
against the session's limits and builds a :class:`scheduler.PredCall`; the scheduler batches it
into a forward and, on the engine thread, turns its logits rows into its value
(``Scheduler._resolve``: the token ids its :func:`chooser` picks, or the rows themselves); the
relay answers from the future's done-callback with :func:`reply_value` and :func:`release` undoes
the admission. Errors on the way become wire errors in ``ops.errors``.

Why no Task per call: every generated token is one ``pred``, so its path through the event loop
is the per-token cost of program-driven decoding, paid in the gap between two forwards (B3:
~0.2 ms of the loop's time per call, times the calls of a forward). The other ops run as one
Task each (``Worker._dispatch``); a ``pred`` is admitted synchronously when its frame is read,
submitted to the scheduler, and answered from a done-callback of the scheduler's future. That
skips the Task, the coroutine frames, the asyncio future that mirrors the scheduler's, and the
per-call timeout context: one loop callback per finished call.

Semantics are those of a Task per call: the run's deadline answers a call still in flight with
TIMEOUT, a closed connection abandons its calls (no reply), and each call's reservations are
released exactly once, when its future is done or cancelled.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from gpu_worker import bias_vectors, contracts, dists, tracing
from gpu_worker import protocol as p
from gpu_worker.grammar import Matcher
from gpu_worker.ops.errors import wire_error
from gpu_worker.ops.io import publish_metered
from gpu_worker.protocol import ErrorCode, ProtocolError
from gpu_worker.refusal_pacing import RefusalPacer
from gpu_worker.scheduler import PredCall
from gpu_worker.sessions import WorkerSession
from gpu_worker.stop_strings import StopWatch
from gpu_worker.text_stream import TextStream

log = logging.getLogger(__name__)

Send = Callable[[asyncio.StreamWriter, dict[str, Any]], None]


class PredContext(Protocol):
    """What the ``pred`` path needs of ``ops.context.OpContext``."""

    vocab_size: int
    max_inflight_preds: int
    #: ``gpu_worker.tokenizer.Tokenizer``: stop strings are looked for in its ``decode``.
    tokenizer: Any
    #: ``gpu_worker.events.EventPublisher``: where ``send_text`` sends (as ``send_to_user`` does).
    events: Any

    @property
    def scheduler(self) -> Any: ...


def chooser(ctx: Any, s: WorkerSession, spec: p.Argmax) -> Callable[[torch.Tensor, int], int]:
    """A function (logits, step) -> token id for a decoded choice (``then``, ``dist_argmax``,
    ``dist_sample``); handles are looked up here, before any forward. A seeded sample at step
    ``j`` of a multi-step ``pred`` uses ``seed + j``: each step its own draw, reproducible."""
    sample = dists.SampleParams.of(spec) if isinstance(spec, p.Sample) else None
    mask = spec.mask
    matcher: Matcher | None = None
    allowed = None
    if isinstance(mask, int):
        matcher = s.grammars.matcher(mask)
    elif mask is not None:
        allowed = dists.allowed_mask(ctx.vocab_size, mask)
    bias = spec.bias
    vector = None if spec.bias_ref is None else s.biases.get(spec.bias_ref)  # held even if released
    advance = spec.advance

    def choose(logits: torch.Tensor, step: int = 0) -> int:
        params = sample
        if step and params is not None and params.seed is not None:
            params = dataclasses.replace(params, seed=(params.seed + step) % 2**63)
        try:
            logits = dists.apply_bias(bias_vectors.apply(logits, vector), bias)
            logits = matcher.restrict(logits) if matcher is not None else dists.restrict(logits, allowed)
            token = dists.argmax(logits) if params is None else dists.sample(logits, params, s.generator)
            if advance and matcher is not None:
                # Saves the LIP a mask_advance round trip per token; the token came from the
                # grammar's own mask, so the matcher accepts it.
                matcher.advance(token)
        except ProtocolError:  # the LIP's choice (e.g. a mask that leaves no token)
            raise
        except Exception as exc:
            log.exception("event=choose_failed session=%s", s.session_id)
            raise ProtocolError(ErrorCode.INTERNAL, f"choosing the token failed: {type(exc).__name__}") from None
        return token

    return choose


def admit(ctx: PredContext, s: WorkerSession, args: p.Pred) -> PredCall:
    """Admit a decoded ``pred`` against the session's limits (no await: the caller submits the
    returned call to the scheduler and must :func:`release` it exactly once)."""
    choose = chooser(ctx, s, args.then) if args.then is not None else None
    if s.inflight_preds >= ctx.max_inflight_preds:
        raise ProtocolError(ErrorCode.BUSY, "too many pred calls in flight for this session")
    s.check_deadline()
    # The handle and the file's length are checked by the scheduler when it plans the call
    # (before any of it lands): a KVFS call here would cost a thread hop per token. Each step
    # past the first appends one more token; steps are cut to what the token budget leaves.
    n = len(args.tokens)
    reserved = s.reserve_tokens_upto(n, n + args.steps - 1)
    s.inflight_preds += 1
    assert args.positions is not None  # decoding made them offsets
    stop = frozenset(args.stop or ())
    call = PredCall(s, args.kv, args.tokens, args.positions, choose=choose, steps=reserved - n + 1, stop=stop)
    call.reserved = reserved
    strings = args.stop_strings or ()
    if args.stop_strings is not None or args.send_text is not None:
        # The same text ``detokenize`` gives (special tokens kept).
        watch = StopWatch(ctx.tokenizer.decode, strings, args.stop_context or (), keep=args.send_context)
        call.watch = watch
        if args.send_text is not None:
            pending = (args.send_pending or "") + watch.context_text(args.send_context)
            call.text_stream = TextStream(args.send_text, pending, strings)
    return call


def release(s: WorkerSession, call: PredCall) -> None:
    """Undo :func:`admit`'s reservations once the call is over (done, failed or abandoned)."""
    s.inflight_preds -= 1
    s.unreserve_tokens(call.reserved)
    if call.ran:  # computed and metered, even if the choice then failed
        # One per forward the call rode: a multi-step call is billed as its steps one call each
        # would be ("Forward calls"), so how a program issues its steps does not change its bill.
        s.usage.pred_calls += max(1, len(call.chosen))
    trace_call(s, call)


def trace_call(s: WorkerSession, call: PredCall) -> None:
    """The call's span in the run's trace: from its arrival to its end, the time it queued
    before its first forward and what the forwards it rode in were (counts only: of their
    ``batch_tokens``, ``own_tokens`` were the call's, the rest other calls')."""
    trace = s.trace
    if not trace.enabled:
        return
    end = time.monotonic()
    wait = (call.started if call.started is not None else end) - call.enqueued
    tokens = len(call.tokens) + max(0, len(call.chosen) - 1)
    if call.forwards == 0:
        trace.add(tracing.SYSCALL, "pred", call.enqueued, end, wait, len(call.tokens), forwards=0)
        return
    if not trace.keeps_spans:  # past the bound: a bucket keeps no attributes, gather none
        trace.add(tracing.SYSCALL, "pred", call.enqueued, end, wait, tokens)
        return
    trace.add(
        tracing.SYSCALL,
        "pred",
        call.enqueued,
        end,
        wait,
        tokens,
        forwards=call.forwards,
        steps=len(call.chosen),
        forward_s=call.forward_s,
        forward_share_s=call.forward_share_s,
        batch_size=call.batch_size,
        batch_tokens=call.batch_tokens,
        own_tokens=call.own_tokens,
    )


def reply_value(s: WorkerSession, call: PredCall, value: Any) -> p.DistRefs | p.ChosenTokens:
    """The reply to a finished call: token ids picked on the engine thread
    (``Scheduler._resolve``) or new Dist handles over its logits rows."""
    if call.choose is None:
        return p.DistRefs(dists=s.dists.add_many(value))
    stop_string = None if call.watch is None else call.watch.matched
    stream = call.text_stream
    if stream is None:
        return p.ChosenTokens(tokens=value, stop_string=stop_string)
    return p.ChosenTokens(
        tokens=value, stop_string=stop_string, sent_text=stream.sent_text(), unsent_text=stream.unsent_text()
    )


@dataclass(eq=False)
class _InFlight:
    req_id: int
    call: PredCall
    timer: asyncio.TimerHandle | None = None
    timed_out: bool = False


class PredRelay:
    """The ``pred`` calls in flight on one session connection."""

    def __init__(
        self,
        ctx: PredContext,
        session: WorkerSession,
        writer: asyncio.StreamWriter,
        send: Send,
        pacer: RefusalPacer | None = None,
    ) -> None:
        self._ctx = ctx
        self._session = session
        self._writer = writer
        self._send = send
        self._pacer = pacer
        self._loop = asyncio.get_running_loop()
        self._pending: set[_InFlight] = set()
        #: Refusals whose replies the pacer holds (each keeps its in-flight slot until sent).
        self._held: set[asyncio.TimerHandle] = set()

    def __len__(self) -> int:
        return len(self._pending) + len(self._held)

    def _refuse(self, req_id: int, exc: BaseException) -> None:
        """Answer a call refused before it was queued, held as the pacer says
        (gpu_worker/refusal_pacing.py)."""
        s = self._session
        error = wire_error(exc, p.Pred.OP, s.session_id)
        reply = p.err_reply(req_id, error)
        hold = self._pacer.hold(s.account, error.code) if self._pacer is not None else 0.0
        if not hold:
            self._send(self._writer, reply)
            return

        def send_held() -> None:
            self._held.discard(handle)
            self._send(self._writer, reply)

        handle = self._loop.call_later(hold, send_held)
        self._held.add(handle)

    def start(self, req_id: int, args: dict[str, Any]) -> None:
        """Decode, admit and submit one ``pred``; a refused call is answered without a forward
        (at once, or after the hold the pacer gives an account that keeps asking)."""
        s = self._session
        try:
            if s.ended:
                raise ProtocolError(ErrorCode.TIMEOUT, "session ended")
            decoded = p.Pred.decode(args, self._ctx.vocab_size)
            call = admit(self._ctx, s, decoded)
        except Exception as exc:
            self._refuse(req_id, exc)
            return
        entry = _InFlight(req_id, call)
        if decoded.stream and call.steps > 1:
            call.on_token = lambda token: self._progress_from_engine(entry, token)
        if call.text_stream is not None:
            call.on_text = lambda delta: self._on_loop(self._send_text, entry, delta)
            # The text before the call's tokens (held back before, or the context's: the
            # prompt's token) goes out now, not with the first token after a forward.
            opening = call.text_stream.take("", False)
            if opening:
                self._send_text(entry, opening)
        try:
            future = self._ctx.scheduler.submit(call)
        except Exception as exc:  # shutting down
            release(s, call)
            self._send(self._writer, p.err_reply(req_id, wire_error(exc, p.Pred.OP, s.session_id)))
            return
        self._pending.add(entry)
        left = s.time_left()
        if left is not None:
            entry.timer = self._loop.call_later(left, self._deadline_passed, entry)
        # Done-callbacks run on the engine thread (settled) or on the loop (cancelled).
        future.add_done_callback(lambda _: self._on_loop(self._finish, entry))

    def abandon_all(self) -> None:
        """The connection closed: its calls get no reply (each is released when cancelled)."""
        for handle in self._held:
            handle.cancel()
        self._held.clear()
        for entry in list(self._pending):
            entry.call.future.cancel()

    def _progress_from_engine(self, entry: _InFlight, token: int) -> None:
        # On the engine thread, before the call's own done-callback: the loop runs both in order,
        # so a progress frame never follows its call's reply. A program that does not read its
        # socket holds at most ``MAX_IN_FLIGHT * MAX_PRED_STEPS`` of these small frames.
        self._on_loop(self._progress, entry, token)

    def _on_loop(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` on the connection's event loop, after what was scheduled before."""
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop closed under a worker shutting down
            pass

    def _send_text(self, entry: _InFlight, delta: str) -> None:
        """Send one delta of a ``send_text`` call as ``send_to_user`` sends a message: metered
        against the run's stream bytes and the account's share of the stored streams. Past
        either nothing more of the call's text goes out: the reply's ``unsent_text`` holds it, and
        the program's own ``send_to_user`` of it meets the quota error."""
        s, stream = self._session, entry.call.text_stream
        assert stream is not None
        if stream.closed or s.ended:
            return
        type_, payload = contracts.encode(contracts.MessageEvent(stream.payload(delta)))
        size = contracts.entry_bytes(type_, payload)
        try:
            outcome = publish_metered(self._ctx.events, s, type_, payload, size)
        except ProtocolError:
            stream.refused()
            return
        stream.sent_one()
        if outcome is not None:  # near the account's share the store may refuse it after all
            outcome.add_done_callback(lambda done: self._on_loop(self._text_refused, stream, size, done))

    def _text_refused(self, stream: TextStream, size: int, done: concurrent.futures.Future) -> None:
        """A delta the store refused (the account's share of the streams was full when it came
        to be stored): it is not billed, and no more of the call's text goes out. Only a send
        near the share waits this way; the program's next ``send_to_user`` meets the refusal."""
        if done.cancelled() or done.exception() is not None or done.result() is None:
            return
        self._session.refund_stream_bytes(size)
        stream.refused()

    def _progress(self, entry: _InFlight, token: int) -> None:
        if entry in self._pending and not entry.timed_out:
            self._send(self._writer, p.more_reply(entry.req_id, p.ChosenTokens(tokens=[token])))

    def _deadline_passed(self, entry: _InFlight) -> None:
        entry.timer = None
        if entry.call.future.cancel():  # still queued or running: the run is out of time
            entry.timed_out = True

    def _finish(self, entry: _InFlight) -> None:
        self._pending.discard(entry)
        if entry.timer is not None:
            entry.timer.cancel()
        s, call, future = self._session, entry.call, entry.call.future
        release(s, call)
        if entry.timed_out:
            reply = p.err_reply(entry.req_id, s.deadline_error())
        elif future.cancelled():
            return
        else:
            reply = self._reply(entry.req_id, call, future)
        self._send(self._writer, reply)

    def _reply(self, req_id: int, call: PredCall, future: concurrent.futures.Future) -> dict[str, Any]:
        s = self._session
        try:
            value = reply_value(s, call, future.result())  # raises the call's error
        except Exception as exc:
            return p.err_reply(req_id, wire_error(exc, p.Pred.OP, s.session_id))
        return p.ok_reply(req_id, value)
