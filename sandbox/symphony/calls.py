"""Request builders shared by the threaded and asyncio SDK flavours.

Each function returns a :class:`Call`: the op name, its wire arguments, built from the op's
typed definition in the protocol module (``gpu_worker/protocol.py``, the same classes the
worker decodes them with), and how to turn the reply into a typed Python value (``Call[T]``).
Keeping this in one place means the sync and async APIs cannot drift apart on the protocol;
the calls that take several round trips are written once in ``flows.py``.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from symphony import checks
from symphony.errors import InvalidArgument
from symphony.wire import protocol

JSON = Any
T = TypeVar("T")


def _nothing(value: Any) -> None:
    """An acknowledgement's reply: there is nothing in it for the program."""
    return None


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request: the op, its wire arguments, and ``parse`` from the reply value to ``T``."""

    op: str
    args: dict[str, Any]
    parse: Callable[[Any], T]


def _call(args: protocol.Args, parse: Callable[[Any], T]) -> Call[T]:
    return Call(args.OP, args.to_wire(), parse)


def _ack(args: protocol.Args) -> Call[None]:
    return Call(args.OP, args.to_wire(), _nothing)


@dataclass(frozen=True)
class Predicted:
    """A ``pred`` call's reply: one Dist handle per requested position (``pred`` without
    ``then``), or the tokens the worker chose (with ``then``; several with ``steps``)."""

    dists: tuple[int, ...] = ()
    tokens: tuple[int, ...] = ()
    #: The stop string the chosen tokens' text came to contain (``stop_strings``), or None.
    stop_string: str | None = None
    #: ``send_text``: the text the worker sent, and what it held back at the end.
    sent_text: str | None = None
    unsent_text: str | None = None


class Decoded(list[int]):
    """The tokens ``pred_tokens`` and ``generate`` return (a list of ids), with ``stop_string``:
    the one of their ``stop_strings`` the tokens' text came to contain, the last token completing
    it, or None when the decode ended otherwise. With ``send_text``: ``sent_text``, the text the
    worker sent to the user, and ``unsent_text``, what it held back at the end (None without)."""

    stop_string: str | None = None
    sent_text: str | None = None
    unsent_text: str | None = None


def _dists(value: dict[str, Any]) -> Predicted:
    return Predicted(dists=tuple(int(d) for d in protocol.DistRefs.from_wire(value).dists))


def _chosen(value: dict[str, Any]) -> Predicted:
    reply = protocol.ChosenTokens.from_wire(value)
    return Predicted(
        tokens=tuple(int(t) for t in reply.tokens),
        stop_string=reply.stop_string,
        sent_text=reply.sent_text,
        unsent_text=reply.unsent_text,
    )


@dataclass(frozen=True)
class Advanced:
    """``mask_advance``'s reply: whether the grammar took the token, and whether it is complete."""

    accepted: bool
    finished: bool


def _advanced(value: dict[str, Any]) -> Advanced:
    reply = protocol.Advanced.from_wire(value)
    return Advanced(bool(reply.accepted), bool(reply.finished))


@dataclass(frozen=True)
class VocabInfo:
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    chat_template: str | None


@dataclass(frozen=True)
class HttpResponse:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self) -> JSON:
        import json

        return json.loads(self.body)


@dataclass(frozen=True)
class TopK:
    """``k`` most likely tokens with their log-probabilities, most likely first."""

    ids: tuple[int, ...]
    logprobs: tuple[float, ...]

    def __iter__(self):
        return iter(zip(self.ids, self.logprobs, strict=True))


def _ints(value: Any) -> list[int]:
    """A list of token ids as the worker sent it (msgpack ints)."""
    return list(value)


def _floats(value: Any) -> list[float]:
    return list(value)


def handle_id(h: Any) -> int:
    """Accept a handle object (anything with ``.id``) or a raw int."""
    value = getattr(h, "id", h)
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidArgument(f"expected a handle, got {type(h).__name__}")
    return value


def _tokens(tokens: Iterable[int]) -> list[int]:
    out = [int(t) for t in tokens]
    if not out:
        raise InvalidArgument("tokens must not be empty", op="pred")
    return out


# --------------------------------------------------------------------------- pred / dists
def pred_chunks(
    kv: Any, tokens: Iterable[int], positions: Sequence[int] | None, then: protocol.Argmax | None
) -> list[tuple[Call[Predicted], list[int]]]:
    """``pred`` split into calls of at most ``MAX_PRED_TOKENS`` tokens (run in order).

    Returns ``(call, wanted)`` pairs: ``wanted`` are indexes into the call's reply list that
    the caller asked for; other rows (the last row of an intermediate chunk) are released.
    """
    toks = _tokens(tokens)
    n = len(toks)
    wanted_abs = [n - 1] if positions is None else [p % n if -n <= p < n else p for p in positions]
    for p in wanted_abs:
        if not 0 <= p < n:
            raise InvalidArgument(f"position {p} outside tokens (length {n})", op="pred")
    step = protocol.MAX_PRED_TOKENS
    kv_id = handle_id(kv)
    parse = _dists if then is None else _chosen
    out: list[tuple[Call[Predicted], list[int]]] = []
    for start in range(0, n, step):
        chunk = toks[start : start + step]
        rows = [p - start for p in wanted_abs if start <= p < start + len(chunk)]
        keep = list(range(len(rows)))
        if not rows:
            rows, keep = [len(chunk) - 1], []
        out.append((_call(protocol.Pred(kv=kv_id, tokens=chunk, positions=rows, then=then), parse), keep))
    return out


@dataclass(frozen=True)
class StepCall:
    """One worker call of ``pred_tokens``: ``tokens`` then up to ``wanted`` tokens decoded in the
    worker, at most ``MAX_PRED_STEPS`` of them (``protocol.Pred``'s ``steps``)."""

    kv: Any
    tokens: list[int]
    wanted: int
    stop: list[int]
    stream: bool
    #: Text that ends the decode (``protocol.Pred``'s ``stop_strings``), and the tokens whose text
    #: comes before this call's (its ``stop_context``: the decode's tokens so far, their tail).
    stop_strings: list[str] = field(default_factory=list)
    stop_context: list[int] = field(default_factory=list)
    #: ``protocol.Pred``'s ``send_text``, ``send_pending`` and ``send_context`` (the worker sends
    #: the chosen tokens' text to the user).
    send_text: dict[str, Any] | None = None
    send_pending: str = ""
    send_context: int = 0

    @property
    def steps(self) -> int:
        return min(self.wanted, protocol.MAX_PRED_STEPS)

    @staticmethod
    def seed(seed: int | None, done: int) -> int | None:
        """The call's seed when ``done`` tokens came before it (the worker adds its step)."""
        return None if seed is None else seed + done

    def calls(self, then: protocol.Argmax) -> list[Call[Predicted]]:
        """The ``pred`` calls, in order: a prompt longer than one call goes first in calls that
        choose a token nobody reads (as ``pred_token``'s do); the last one decodes the steps."""
        head = [call for call, _ in pred_chunks(self.kv, self.tokens, None, then)]
        watched = self.stop_strings or self.send_text is not None
        context = self.stop_context[-protocol.MAX_STOP_CONTEXT_TOKENS :] if watched else []
        last = protocol.Pred(
            kv=handle_id(self.kv),
            tokens=head.pop().args["tokens"],
            then=then,
            steps=self.steps,
            stop=self.stop or None,
            stream=self.stream,
            stop_strings=self.stop_strings or None,
            stop_context=context or None,
            send_text=self.send_text,
            # Set only with ``send_text`` (``SendText.step``).
            send_pending=self.send_pending or None,
            send_context=self.send_context,
        )
        return [*head, _call(last, _chosen)]

    def ended(self, reply: Predicted) -> bool:
        """Whether the decode is over after this call's ``reply``: a stop token or string, or
        fewer steps than asked (a step could not run; the next call would say why)."""
        chosen = reply.tokens
        return reply.stop_string is not None or chosen[-1] in self.stop or len(chosen) < self.steps


@dataclass(frozen=True)
class SendText:
    """``pred_tokens``' ``send_text``: the worker sends the chosen tokens' text to the run's user
    in messages ``{**message, "delta": text}`` (``protocol.Pred``'s ``send_text``); ``pending``:
    text not sent yet that goes out first; ``context``: the last tokens of ``stop_context`` whose
    text was not sent either."""

    message: dict[str, Any]
    pending: str = ""
    context: int = 0

    def step(self, call: StepCall, pending: str, context: int) -> StepCall:
        """``call`` sending its text, going on from ``pending`` and ``context`` tokens."""
        return dataclasses.replace(call, send_text=self.message, send_pending=pending, send_context=context)


def send_text(message: Any, pending: Any, context: Any, op: str) -> SendText | None:
    """``pred_tokens``' ``send_text``, ``send_pending`` and ``send_context`` (the message's size
    and JSON-ness are the worker's to refuse: ``protocol.MAX_SEND_MESSAGE_BYTES``)."""
    if message is None:
        if pending or context:
            raise InvalidArgument("send_pending and send_context go with send_text", op=op)
        return None
    if not isinstance(message, Mapping):
        raise InvalidArgument(f"send_text must be a JSON object (a dict), not {type(message).__name__}", op=op)
    if not isinstance(pending, str):
        raise InvalidArgument(f"send_pending must be a string, not {type(pending).__name__}", op=op)
    if isinstance(context, bool) or not isinstance(context, int) or context < 0:
        raise InvalidArgument(f"send_context must be a non-negative integer, not {context!r}", op=op)
    return SendText(dict(message), pending, context)


class TokenRelay:
    """Hands a multi-step call's tokens to ``on_token`` once each, in order: those its progress
    frames carried (:meth:`more`), then the rest of its reply (:meth:`rest`)."""

    def __init__(self, on_token: Callable[[int], Any] | None) -> None:
        self.on_token = on_token
        self.sent = 0

    def more(self, value: dict[str, Any]) -> None:
        """A progress frame of the call (``ChosenTokens``: the tokens chosen since the last)."""
        for token in protocol.ChosenTokens.from_wire(value).tokens:
            self.sent += 1
            if self.on_token is not None:
                self.on_token(int(token))

    def rest(self, reply: Predicted) -> list[int]:
        """The call's chosen tokens, after telling ``on_token`` those not told yet."""
        chosen = list(reply.tokens)
        if self.on_token is not None:
            for token in chosen[self.sent :]:
                self.on_token(token)
        return chosen


def choice(
    kind: str, temperature: float, top_p: float, top_k: int, seed: int | None, mask: Any, bias: Any
) -> protocol.Argmax:
    """The ``then`` of a fused ``pred`` (token chosen worker-side in the same round trip)."""
    if kind == "sample":
        return protocol.Sample(**_choice_params(temperature, top_p, top_k, seed, mask, bias))
    return protocol.Argmax(**_mask_bias(mask, bias))


def then_choose(
    temperature: float, top_p: float, top_k: int, seed: int | None, mask: Any, bias: Any
) -> protocol.Argmax:
    """The ``then`` of ``pred_token``: greedy at temperature 0, otherwise a sample."""
    if temperature == 0:
        return choice("argmax", 0, 1, 0, None, mask, bias)
    return choice("sample", temperature, top_p, top_k, seed, mask, bias)


@dataclass(frozen=True)
class Advancing:
    """A grammar state given as ``mask=`` that the worker advances by the token it chooses
    (``GrammarState.advancing()``): one round trip a token instead of two. The state's
    ``finished`` is then not tracked here; the grammar allows EOS only at its end."""

    id: int


def _mask_bias(mask: Any, bias: Any) -> dict[str, Any]:
    """The ``mask``, ``bias``/``bias_ref`` and ``advance`` fields of a choice, from what a LIP
    passes: ``bias`` is a sparse map or a worker-side vector (``BiasVector``, anything with
    ``bias_id``)."""
    params: dict[str, Any] = {}
    if isinstance(mask, Advancing):
        params["advance"] = True
    if mask is not None:
        params["mask"] = mask.id if hasattr(mask, "id") else [int(t) for t in mask]
    if bias is not None:
        ref = getattr(bias, "bias_id", None)
        if ref is not None:
            params["bias_ref"] = int(ref)
        elif isinstance(bias, Mapping):
            if len(bias) > protocol.MAX_MAP_ENTRIES:
                raise InvalidArgument(
                    f"a sparse bias map holds at most {protocol.MAX_MAP_ENTRIES} entries, this one {len(bias)}:"
                    " build a bias vector once in the worker with sy.bias_set(ids, value) or"
                    " sy.bias_vector(values) and pass it as bias= (it is reused by every call)",
                    op="bias",
                )
            params["bias"] = {int(k): float(v) for k, v in bias.items()}
        else:
            raise InvalidArgument(
                f"bias= takes a {{token_id: offset}} map or a bias vector (sy.bias_set / sy.bias_vector),"
                f" not {type(bias).__name__}"
            )
    return params


def _choice_params(
    temperature: float, top_p: float, top_k: int, seed: int | None, mask: Any, bias: Any
) -> dict[str, Any]:
    params: dict[str, Any] = {"temperature": float(temperature), "top_p": float(top_p), "top_k": int(top_k)}
    if seed is not None:
        params["seed"] = int(seed)
    params.update(_mask_bias(mask, bias))
    return params


def dist_sample(
    dist: Any, temperature: float, top_p: float, top_k: int, seed: int | None, mask: Any, bias: Any
) -> Call[int]:
    params = _choice_params(temperature, top_p, top_k, seed, mask, bias)
    return _call(protocol.DistSample(dist=handle_id(dist), **params), int)


def dist_argmax(dist: Any, mask: Any, bias: Any) -> Call[int]:
    return _call(protocol.DistArgmax(dist=handle_id(dist), **_mask_bias(mask, bias)), int)


def _topk(v: dict[str, Any]) -> TopK:
    reply = protocol.TopKReply.from_wire(v)
    return TopK(tuple(reply.ids), tuple(reply.logprobs))


def dist_topk(dist: Any, k: int) -> Call[TopK]:
    return _call(protocol.DistTopk(dist=handle_id(dist), k=int(k)), _topk)


def dist_logprob(dist: Any, token_ids: Iterable[int]) -> Call[list[float]]:
    return _call(protocol.DistLogprob(dist=handle_id(dist), token_ids=[int(t) for t in token_ids]), _floats)


def _fp16(data: bytes) -> list[float]:
    return list(struct.unpack(f"<{len(data) // 2}e", data))


def dist_full(dist: Any) -> Call[list[float]]:
    return _call(protocol.DistFull(dist=handle_id(dist)), _fp16)


def dist_release(dists: Iterable[Any]) -> Call[None]:
    return _ack(protocol.DistRelease(dists=[handle_id(d) for d in dists]))


# ------------------------------------------------------------------------------------ KVFS
def _kv(value: Any) -> int:
    return int(protocol.KvRef.from_wire(value).kv)


def kv_create(name: str | None, cache: bool = True, durable: bool = True) -> Call[int]:
    return _call(protocol.KvCreate(name=name, cache=cache, durable=durable), _kv)


def kv_open(name: str, mode: str) -> Call[int]:
    if mode not in ("r", "w"):
        raise InvalidArgument('mode must be "r" or "w"', op="kv_open")
    return _call(protocol.KvOpen(name=name, mode=mode), _kv)


def kv_fork(kv: Any) -> Call[int]:
    return _call(protocol.KvFork(kv=handle_id(kv)), _kv)


def kv_close(kv: Any) -> Call[None]:
    return _ack(protocol.KvClose(kv=handle_id(kv)))


def kv_remove(name: str) -> Call[None]:
    return _ack(protocol.KvRemove(name=name))


def kv_len(kv: Any) -> Call[int]:
    return _call(protocol.KvLen(kv=handle_id(kv)), int)


def kv_tokens(kv: Any) -> Call[list[int]]:
    return _call(protocol.KvTokens(kv=handle_id(kv)), _ints)


def kv_truncate(kv: Any, n: int) -> Call[None]:
    return _ack(protocol.KvTruncate(kv=handle_id(kv), n=int(n)))


def kv_extract(kv: Any, start: int, end: int) -> Call[int]:
    return _call(protocol.KvExtract(kv=handle_id(kv), start=int(start), end=int(end)), _kv)


def kv_merge(a: Any, b: Any) -> Call[int]:
    return _call(protocol.KvMerge(a=handle_id(a), b=handle_id(b)), _kv)


def kv_pin(name: str, pinned: bool) -> Call[None]:
    return _ack(protocol.KvPin(name=name, pinned=bool(pinned)))


# ------------------------------------------------------------------------------- tokenizer
def tokenize(text: str, add_special_tokens: bool) -> Call[list[int]]:
    return _call(protocol.Tokenize(text=text, add_special_tokens=bool(add_special_tokens)), _ints)


def detokenize(ids: Iterable[int], skip_special_tokens: bool) -> Call[str]:
    args = protocol.Detokenize(ids=[int(t) for t in ids], skip_special_tokens=bool(skip_special_tokens))
    return _call(args, str)


def _vocab(v: dict[str, Any]) -> VocabInfo:
    reply = protocol.VocabInfoReply.from_wire(v)
    return VocabInfo(int(reply.vocab_size), tuple(reply.eos_token_ids), reply.bos_token_id, reply.chat_template)


def vocab_info() -> Call[VocabInfo]:
    return _call(protocol.VocabInfo(), _vocab)


def apply_chat_template(messages: Sequence[Mapping[str, str]], add_generation_prompt: bool) -> Call[list[int]]:
    msgs = [{"role": str(m["role"]), "content": str(m["content"])} for m in messages]
    args = protocol.ApplyChatTemplate(messages=msgs, add_generation_prompt=bool(add_generation_prompt))
    return _call(args, _ints)


# ------------------------------------------------------------------------------------- I/O
def send_to_user(data: JSON) -> Call[None]:
    if type(data) is not str:  # the common case (text) needs no walk
        data = checks.json_keys(data, "send_to_user", "data")
    return _ack(protocol.SendToUser(data=data))


def _http(v: dict[str, Any]) -> HttpResponse:
    reply = protocol.HttpReply.from_wire(v)
    return HttpResponse(int(reply.status), dict(reply.headers or {}), bytes(reply.body or b""))


def http_fetch(
    url: str, method: str, headers: Mapping[str, str] | None, body: bytes | str | None, timeout: float | None
) -> Call[HttpResponse]:
    args = protocol.HttpFetch(
        url=url,
        method=method,
        headers=dict(headers) if headers else None,
        body=body,
        timeout=None if timeout is None else float(timeout),
    )
    return _call(args, _http)


def sleep(seconds: float) -> Call[None]:
    return _ack(protocol.Sleep(seconds=float(seconds)))


# --------------------------------------------------------------------------------- grammar
def grammar(json_schema: Any, regex: str | None, ebnf: str | None) -> Call[int]:
    if sum(v is not None for v in (json_schema, regex, ebnf)) != 1:
        raise InvalidArgument("give exactly one of json_schema, regex, ebnf", op="grammar")
    args = protocol.Grammar(json_schema=json_schema, regex=regex, ebnf=ebnf)
    return _call(args, lambda v: int(protocol.GrammarRef.from_wire(v).grammar))


def grammar_state(g: Any) -> Call[int]:
    return _call(protocol.GrammarState(grammar=handle_id(g)), lambda v: int(protocol.MaskRef.from_wire(v).mask))


def mask_advance(mask: Any, token: int) -> Call[Advanced]:
    return _call(protocol.MaskAdvance(mask=handle_id(mask), token=int(token)), _advanced)


# ----------------------------------------------------------------------------- bias vectors
def _bias(value: dict[str, Any]) -> int:
    return int(protocol.BiasRef.from_wire(value).bias)


def bias_set(ids: Iterable[int], value: float, vocab_size: int) -> Call[int]:
    """``value`` on each of ``ids``: sent as the ids, or as a dense vector when they are more
    than one list of a frame may hold (``MAX_ARRAY_ITEMS``)."""
    token_ids = sorted({int(t) for t in ids})
    if not token_ids:
        raise InvalidArgument("ids must not be empty", op="bias_create")
    if len(token_ids) <= protocol.MAX_ARRAY_ITEMS:
        return _call(protocol.BiasCreate(ids=token_ids, value=float(value)), _bias)
    if token_ids[0] < 0 or token_ids[-1] >= vocab_size:
        raise InvalidArgument(f"ids must be token ids in [0, {vocab_size})", op="bias_create")
    dense = [0.0] * vocab_size
    for t in token_ids:
        dense[t] = float(value)
    return bias_vector(dense, vocab_size)


def bias_vector(values: Sequence[float], vocab_size: int) -> Call[int]:
    """One offset per token, sent as float32 little-endian bytes (``vocab_size * 4``)."""
    if len(values) != vocab_size:
        raise InvalidArgument(
            f"values must hold one offset per token ({vocab_size}), got {len(values)}", op="bias_create"
        )
    return _call(protocol.BiasCreate(values=[float(v) for v in values]), _bias)


def bias_release(bias: Any) -> Call[None]:
    return _ack(protocol.BiasRelease(bias=int(getattr(bias, "bias_id", bias))))


def finish(result: JSON, error: str | None) -> Call[None]:
    return _ack(protocol.Finish(result=checks.json_keys(result, "finish", "result"), error=error))


# -------------------------------------------------------------------------------- channels
@dataclass(frozen=True)
class Received:
    """A message read from a channel or subscription: its value and the run id that sent it."""

    data: JSON
    sender: str


def _received(v: dict[str, Any]) -> Received:
    reply = protocol.ChannelMessage.from_wire(v)
    return Received(reply.data, str(reply.sender))


def _wait(timeout: float | None, op: str) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 <= timeout <= protocol.MAX_SLEEP_S:
        raise InvalidArgument(f"timeout must be None or seconds in [0, {protocol.MAX_SLEEP_S:g}]", op=op)
    return float(timeout)


def channel_send(name: str, data: JSON) -> Call[None]:
    return _ack(protocol.ChannelSend(name=name, data=checks.channel_value(data, "channel_send")))


def channel_recv(name: str, timeout: float | None) -> Call[Received]:
    return _call(protocol.ChannelRecv(name=name, timeout=_wait(timeout, "channel_recv")), _received)


def channel_publish(name: str, data: JSON) -> Call[int]:
    return _call(protocol.ChannelPublish(name=name, data=checks.channel_value(data, "channel_publish")), int)


def channel_subscribe(name: str) -> Call[int]:
    return _call(protocol.ChannelSubscribe(name=name), lambda v: int(protocol.SubscriptionRef.from_wire(v).sub))


def channel_next(sub: int, timeout: float | None) -> Call[Received]:
    return _call(protocol.ChannelNext(sub=sub, timeout=_wait(timeout, "channel_next")), _received)


def channel_unsubscribe(sub: int) -> Call[None]:
    return _ack(protocol.ChannelUnsubscribe(sub=sub))


def channel_close(name: str) -> Call[None]:
    return _ack(protocol.ChannelClose(name=name))


# ------------------------------------------------------------------------------ processes
def spawn(entry: str | None, args: JSON, limits: Mapping[str, Any] | None) -> Call[str]:
    """``entry``: ``module[:function]`` of the program's bundle; None, "" or "self": the program
    itself (its ``main``). ``args`` must be JSON (checked here, before anything is sent)."""
    import json

    if entry is None or entry == "self":
        entry = ""
    if not isinstance(entry, str):
        raise InvalidArgument(f"entry must be a module name or None, not {type(entry).__name__}", op="spawn")
    try:
        json.dumps(args, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"args must be JSON data: {exc}", op="spawn") from None
    if limits is not None and not isinstance(limits, Mapping):
        raise InvalidArgument("limits must be a mapping of run limits", op="spawn")
    spec = protocol.Spawn(entry=entry, args=args, limits=None if limits is None else dict(limits))
    return _call(spec, lambda v: str(protocol.Spawned.from_wire(v).child))


def child_wait(child: str, timeout: float | None) -> Call[JSON]:
    if timeout is not None and (not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout < 0):
        raise InvalidArgument("timeout must be a number of seconds >= 0 or None", op="child_wait")
    args = protocol.ChildWait(child=child, timeout=None if timeout is None else float(timeout))
    return _call(args, lambda v: _child_outcome(protocol.ChildStatus.from_wire(v), timeout))


def _child_outcome(status: Any, timeout: float | None) -> JSON:
    """The child's result, or the error it ended with raised as :class:`ChildFailed`."""
    from symphony.errors import ChildFailed, DeadlineExceeded

    if status.status == "succeeded":
        return status.result
    if status.status == "running":
        raise DeadlineExceeded(f"child run {status.child} still running after {timeout}s", op="child_wait")
    return _raise(ChildFailed(status.child, status.status, status.error))


def _raise(exc: BaseException) -> Any:
    raise exc


def child_cancel(child: str) -> Call[bool]:
    return _call(protocol.ChildCancel(child=child), bool)
