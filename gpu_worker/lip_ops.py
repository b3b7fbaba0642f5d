"""Handlers of the LIP-facing ops (DESIGN.md §3), one coroutine per op; ``pred`` is three plain
functions instead (admit, release, reply value), relayed by ``gpu_worker.pred_relay``.

Each handler gets the authenticated :class:`Session` and the request args, validates them, and
returns the reply value or raises :class:`ProtocolError`. KVFS calls run on a small thread
pool (they may move page data and wait for the engine lock); forwards go through the scheduler.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import msgpack
import torch

from gpu_worker import brokered_io, dists
from gpu_worker.grammar import Matcher
from gpu_worker.protocol import MAX_NAME_CHARS, MAX_PRED_TOKENS, MAX_TEXT_CHARS, ErrorCode, ProtocolError
from gpu_worker.scheduler import PredCall
from gpu_worker.sessions import Session
from gpu_worker.validate import bad, get_bool, get_int, get_str, is_int, token_list

if TYPE_CHECKING:
    from gpu_worker.server import Worker

log = logging.getLogger(__name__)

MAX_POSITIONS = 1024
MAX_SLEEP_S = 3600.0
MAX_MESSAGE_BYTES = 1024 * 1024

Handler = Callable[["Worker", Session, dict[str, Any]], Awaitable[Any]]
HANDLERS: dict[str, Handler] = {}


def op(name: str) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        HANDLERS[name] = fn
        return fn

    return register


# ------------------------------------------------------------------------------- session
@op("vocab_info")
async def vocab_info(w: Worker, s: Session, args: dict[str, Any]) -> Any:
    tok = w.tokenizer
    return {
        "vocab_size": w.vocab_size,
        "eos_token_ids": tok.eos_token_ids,
        "bos_token_id": tok.bos_token_id,
        "chat_template": tok.chat_template,
    }


@op("finish")
async def finish(w: Worker, s: Session, args: dict[str, Any]) -> Any:
    s.set_result(args.get("result"), args.get("error"))
    log.info("event=finish session=%s tenant=%s run=%s", s.session_id, s.tenant, s.run_id)


@op("send_to_user")
async def send_to_user(w: Worker, s: Session, args: dict[str, Any]) -> Any:
    if "data" not in args:
        raise bad("data is required")
    data = args["data"]
    if isinstance(data, str):
        if len(data) > MAX_TEXT_CHARS:
            raise bad(f"text longer than {MAX_TEXT_CHARS} characters")
        w.events.publish(s.run_id, "token", {"text": data})
    else:
        if isinstance(data, bytes) or len(msgpack.packb(data, use_bin_type=True)) > MAX_MESSAGE_BYTES:
            raise bad(f"message must be JSON-like data of at most {MAX_MESSAGE_BYTES} bytes")
        try:
            # What readers of the stream parse is JSON: NaN, Infinity or bytes inside would reach
            # a browser's JSON.parse or an OpenAI client as something they cannot read.
            json.dumps(data, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise bad(f"message must be JSON data: {exc}") from None
        w.events.publish(s.run_id, "message", {"data": data})


# ----------------------------------------------------------------------------- tokenizer
@op("tokenize")
async def tokenize(w: Worker, s: Session, args: dict[str, Any]) -> Any:
    text = get_str(args, "text", MAX_TEXT_CHARS)
    special = get_bool(args, "add_special_tokens", False)
    return await w.in_thread(w.tokenizer.encode, text, special)


@op("detokenize")
async def detokenize(w: Worker, s: Session, args: dict[str, Any]) -> Any:
    ids = token_list(args.get("ids"), w.vocab_size, MAX_TEXT_CHARS, "ids", min_len=0)
    skip = get_bool(args, "skip_special_tokens", False)
    return await w.in_thread(w.tokenizer.decode, ids, skip)


@op("apply_chat_template")
async def apply_chat_template(w: Worker, s: Session, args: dict[str, Any]) -> Any:
    messages = args.get("messages")
    if not isinstance(messages, list) or not 1 <= len(messages) <= 1000:
        raise bad("messages must be a list of {role, content} maps")
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise bad("each message must be a map with string role and content")
    gen = get_bool(args, "add_generation_prompt", True)
    try:
        return await w.in_thread(w.tokenizer.apply_chat_template, messages, gen)
    except ValueError as exc:
        raise bad(str(exc)) from None


# ---------------------------------------------------------------------------------- KVFS
def _name(args: dict[str, Any], key: str = "name") -> str:
    return get_str(args, key, MAX_NAME_CHARS)


def _h(args: dict[str, Any], key: str = "kv") -> int:
    return get_int(args, key, 0)


@op("kv_create")
async def kv_create(w: Worker, s: Session, args: dict[str, Any]) -> Any:
    name = args.get("name")
    if name is not None:
        name = _name(args)
    return {"kv": await w.kv(w.kvfs.create, s.owner, name)}


@op("kv_open")
async def kv_open(w: Worker, s: Session, args: dict[str, Any]) -> Any:
    mode = get_str(args, "mode", 1, "r")
    if mode not in ("r", "w"):
        raise bad('mode must be "r" or "w"')
    return {"kv": await w.kv(w.kvfs.open, s.owner, _name(args), mode)}


@op("kv_fork")
async def kv_fork(w: Worker, s: Session, args: dict[str, Any]) -> Any:
    return {"kv": await w.kv(w.kvfs.fork, s.owner, _h(args))}


@op("kv_close")
async def kv_close(w: Worker, s: Session, args: dict[str, Any]) -> Any:
    await w.kv(w.kvfs.close, s.owner, _h(args))


@op("kv_remove")
async def kv_remove(w: Worker, s: Session, args: dict[str, Any]) -> Any:
    await w.kv(w.kvfs.remove, s.tenant, _name(args))


@op("kv_len")
async def kv_len(w: Worker, s: Session, args: dict[str, Any]) -> Any:
    return await w.kv(w.kvfs.length, s.owner, _h(args))


@op("kv_tokens")
async def kv_tokens(w: Worker, s: Session, args: dict[str, Any]) -> Any:
    return await w.kv(w.kvfs.tokens, s.owner, _h(args))


@op("kv_truncate")
async def kv_truncate(w: Worker, s: Session, args: dict[str, Any]) -> Any:
    await w.kv(w.kvfs.truncate, s.owner, _h(args), get_int(args, "n", 0))


@op("kv_extract")
async def kv_extract(w: Worker, s: Session, args: dict[str, Any]) -> Any:
    h = await w.kv(w.kvfs.extract, s.owner, _h(args), get_int(args, "start", 0), get_int(args, "end", 0))
    return {"kv": h}


@op("kv_merge")
async def kv_merge(w: Worker, s: Session, args: dict[str, Any]) -> Any:
    return {"kv": await w.kv(w.kvfs.merge, s.owner, _h(args, "a"), _h(args, "b"))}


@op("kv_pin")
async def kv_pin(w: Worker, s: Session, args: dict[str, Any]) -> Any:
    await w.kv(w.kvfs.pin, s.tenant, _name(args), get_bool(args, "pinned", True))


# ---------------------------------------------------------------------------------- pred
def _positions(args: dict[str, Any], n: int) -> tuple[int, ...]:
    raw = args.get("positions")
    if raw is None:
        raw = args.get("returns")
    if raw is None or raw == "last":
        return (n - 1,)
    if not isinstance(raw, list | tuple) or not 1 <= len(raw) <= MAX_POSITIONS:
        raise bad(f"positions must be a list of 1..{MAX_POSITIONS} offsets into tokens")
    rows = []
    for p in raw:
        if not is_int(p) or not -n <= p < n:
            raise bad(f"position {p!r} outside tokens (length {n})")
        rows.append(p % n)
    return tuple(rows)


def _choice(w: Worker, s: Session, spec: object) -> Callable[[torch.Tensor], int]:
    """Parse ``then`` / dist op args into a function logits -> token id (validated up front)."""
    if spec == "argmax":
        spec = {"argmax": {}}
    if not isinstance(spec, dict) or len(spec) != 1:
        raise bad('then must be "argmax", {"argmax": {...}} or {"sample": {...}}')
    ((kind, params),) = spec.items()
    if kind not in ("argmax", "sample") or not isinstance(params, dict):
        raise bad('then must be "argmax", {"argmax": {...}} or {"sample": {...}}')
    return _chooser(w, s, kind, params)


def _chooser(w: Worker, s: Session, kind: str, params: dict[str, Any]) -> Callable[[torch.Tensor], int]:
    sample = dists.SampleParams.from_args(params) if kind == "sample" else None
    mask = params.get("mask")
    matcher: Matcher | None = None
    allowed = None
    if is_int(mask):
        matcher = s.grammars.matcher(mask)
    elif mask is not None:
        allowed = dists.allowed_mask(w.vocab_size, mask)
    bias = params.get("bias")
    advance = params.get("advance", False)
    if not isinstance(advance, bool):
        raise bad("advance must be true or false")
    if advance and matcher is None:
        raise bad("advance needs a grammar state handle as mask")

    def choose(logits: torch.Tensor) -> int:
        logits = dists.apply_bias(logits, bias)
        logits = matcher.restrict(logits) if matcher is not None else dists.restrict(logits, allowed)
        token = dists.argmax(logits) if sample is None else dists.sample(logits, sample, s.generator)
        if advance:
            # Saves the LIP a mask_advance round trip per token (B5); the token came from the
            # grammar's own mask, so the matcher accepts it.
            matcher.advance(token)
        return token

    return choose


# ``pred`` is not in HANDLERS: the server relays it without a Task (``pred_relay.PredRelay``), using
# the three steps below, since it is the call every generated token makes.
def admit_pred(w: Worker, s: Session, args: dict[str, Any]) -> PredCall:
    """Validate a ``pred`` and admit it against the session's limits (no await: the caller
    submits the returned call to the scheduler and must ``release_pred`` it exactly once)."""
    kv = _h(args)
    tokens = token_list(args.get("tokens"), w.vocab_size, MAX_PRED_TOKENS)
    rows = _positions(args, len(tokens))
    then = args.get("then")
    choose = _choice(w, s, then) if then is not None else None
    if s.inflight_preds >= w.config.scheduler.max_inflight_preds_per_session:
        raise ProtocolError(ErrorCode.BUSY, "too many pred calls in flight for this session")
    s.check_deadline()
    # The handle and the file's length are checked by the scheduler when it plans the call
    # (before any of it lands): a KVFS call here would cost a thread hop per token.
    s.reserve_tokens(len(tokens))
    s.inflight_preds += 1
    return PredCall(s, kv, tokens, rows, choose=choose)


def release_pred(s: Session, call: PredCall) -> None:
    """Undo ``admit_pred``'s reservations once the call is over (done, failed or abandoned)."""
    s.inflight_preds -= 1
    s.unreserve_tokens(len(call.tokens))
    if call.ran:  # computed and metered, even if the choice then failed
        s.usage.pred_calls += 1


def pred_value(s: Session, call: PredCall, value: Any) -> Any:
    """The reply to a finished call: token ids picked on the engine thread
    (``Scheduler._resolve``) or new Dist handles over its logits rows."""
    if call.choose is None:
        return {"dists": s.dists.add_many(value)}
    return {"tokens": value}


# --------------------------------------------------------------------------------- dists
@op("dist_sample")
async def dist_sample(w: Worker, s: Session, args: dict[str, Any]) -> Any:
    row = s.dists.get(args.get("dist"))
    return _chooser(w, s, "sample", args)(row)


@op("dist_argmax")
async def dist_argmax(w: Worker, s: Session, args: dict[str, Any]) -> Any:
    row = s.dists.get(args.get("dist"))
    return _chooser(w, s, "argmax", args)(row)


@op("dist_topk")
async def dist_topk(w: Worker, s: Session, args: dict[str, Any]) -> Any:
    return dists.topk(s.dists.get(args.get("dist")), args.get("k"))


@op("dist_logprob")
async def dist_logprob(w: Worker, s: Session, args: dict[str, Any]) -> Any:
    return dists.logprob(s.dists.get(args.get("dist")), args.get("token_ids"))


@op("dist_full")
async def dist_full(w: Worker, s: Session, args: dict[str, Any]) -> Any:
    return dists.full(s.dists.get(args.get("dist")))


@op("dist_release")
async def dist_release(w: Worker, s: Session, args: dict[str, Any]) -> Any:
    ids = args.get("dists")
    if not isinstance(ids, list) or len(ids) > 65536:
        raise bad("dists must be a list of handles")
    s.dists.release(ids)


# ------------------------------------------------------------------------------- grammar
@op("grammar")
async def grammar(w: Worker, s: Session, args: dict[str, Any]) -> Any:
    compiled = await w.in_thread(w.grammar.compile, args)
    return {"grammar": s.grammars.add_grammar(compiled)}


@op("grammar_state")
async def grammar_state(w: Worker, s: Session, args: dict[str, Any]) -> Any:
    compiled = s.grammars.grammar(args.get("grammar"))
    return {"mask": s.grammars.add_matcher(Matcher(compiled, w.vocab_size))}


@op("mask_advance")
async def mask_advance(w: Worker, s: Session, args: dict[str, Any]) -> Any:
    return s.grammars.matcher(args.get("mask")).advance(args.get("token"))


# ---------------------------------------------------------------------------- brokered I/O
@op("http_fetch")
async def http_fetch(w: Worker, s: Session, args: dict[str, Any]) -> Any:
    s.check_deadline()
    cap = w.config.http_timeout_s
    left = s.time_left()
    if left is not None:
        cap = min(cap, left)
    req = brokered_io.parse_request(args, cap)
    s.usage.io_calls += 1
    address = await w.in_thread(brokered_io.check_allowed, req, list(s.limits.allowed_hosts))
    log.info(
        "event=http_fetch session=%s tenant=%s run=%s host=%s:%d", s.session_id, s.tenant, s.run_id, req.host, req.port
    )
    return await w.blocked_on_io(s, w.in_thread(brokered_io.fetch, req, address, w.config.http_max_bytes))


@op("sleep")
async def sleep(w: Worker, s: Session, args: dict[str, Any]) -> Any:
    seconds = args.get("seconds")
    if not isinstance(seconds, int | float) or isinstance(seconds, bool) or not 0 <= seconds <= MAX_SLEEP_S:
        raise bad(f"seconds must be a number in [0, {MAX_SLEEP_S}]")
    s.check_deadline()
    s.usage.io_calls += 1
    left = s.time_left()
    if left is not None and seconds > left:
        await w.blocked_on_io(s, asyncio.sleep(max(left, 0)))
        raise ProtocolError(ErrorCode.TIMEOUT, f"run deadline of {s.limits.deadline_s}s passed during sleep")
    await w.blocked_on_io(s, asyncio.sleep(seconds))
