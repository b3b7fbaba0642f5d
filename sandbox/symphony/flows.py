"""The SDK calls that take more than one request, written once for both faces.

A flow is a generator that does no I/O: it yields what it needs sent (a
:class:`~symphony.calls.Call`, a :class:`Batch` of calls to send in one write, or a
:class:`Streamed` call whose progress frames feed ``on_token``) and is sent back the parsed
reply; what it returns is the call's result. The threaded face (``api.Session``) drives a flow
with blocking calls and the asyncio face (``aio.AsyncSession``) with awaits, so prompt chunking,
the decode-step loop, stop tokens and grammar ends cannot drift apart between them. Handles are
ids here; each face wraps them in its own handle types.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeAlias, TypeVar

from symphony import calls, checks
from symphony.calls import Call, Decoded, Predicted, TokenRelay
from symphony.errors import InvalidArgument
from symphony.handles import GrammarHandle, GrammarStateHandle
from symphony.wire import protocol

T = TypeVar("T")


@dataclass(frozen=True)
class Batch:
    """Calls sent together in one write; the flow is sent back their parsed replies, in order."""

    calls: list[Call[Predicted]]


@dataclass(frozen=True)
class Streamed:
    """A multi-step ``pred`` whose progress frames go to ``relay.more`` before its reply."""

    call: Call[Predicted]
    relay: TokenRelay


Request: TypeAlias = Call[Any] | Batch | Streamed
#: A flow returning ``T``: yields requests, is sent their parsed replies.
Flow: TypeAlias = Generator[Request, Any, T]


@dataclass(frozen=True)
class PredIds:
    """``pred``'s Dist ids: those asked for, in order, and those of rows nobody asked for (the
    last row of a chunk before the last), which the face releases."""

    kept: list[int]
    dropped: list[int]


class Choice(NamedTuple):
    """How ``pred_token`` and its kin choose a token (the ``then`` of a fused ``pred``); a
    tuple, as it is made once per call on the decode path."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    mask: Any = None
    bias: Any = None

    def then(self, seed: int | None = None) -> Any:
        checks.mask(self.mask, "pred")
        return calls.then_choose(self.temperature, self.top_p, self.top_k, seed, self.mask, self.bias)


def pred(kv: Any, tokens: Iterable[int], positions: Sequence[int] | None) -> Flow[PredIds]:
    kept: list[int] = []
    dropped: list[int] = []
    for call, keep in calls.pred_chunks(kv, checks.token_ids(tokens, "pred"), positions, None):
        reply: Predicted = yield call
        kept.extend(reply.dists[i] for i in keep)
        dropped.extend(d for i, d in enumerate(reply.dists) if i not in keep)
    return PredIds(kept, dropped)


def pred_token(kv: Any, tokens: Iterable[int], choice: Choice) -> Flow[int]:
    then = choice.then(choice.seed)
    reply: Predicted | None = None
    for call, _ in calls.pred_chunks(kv, checks.token_ids(tokens, "pred"), None, then):
        reply = yield call
    assert reply is not None  # pred_chunks makes at least one call (or raises)
    return reply.tokens[-1]


def pred_token_many(steps: Sequence[tuple[Any, Iterable[int]]], choice: Choice, cap: int) -> Flow[list[int]]:
    """Each file's chunks in order, one round per chunk index; a round of more files than
    ``cap`` (what a connection may have in flight) goes in several writes."""
    then = choice.then(choice.seed)
    chunked = [calls.pred_chunks(kv, checks.token_ids(tokens, "pred"), None, then) for kv, tokens in steps]
    tokens: list[int] = [0] * len(chunked)
    for r in range(max((len(c) for c in chunked), default=0)):
        lanes = [i for i, c in enumerate(chunked) if r < len(c)]
        for group in (lanes[g : g + cap] for g in range(0, len(lanes), cap)):
            replies: list[Predicted] = yield Batch([chunked[i][r][0] for i in group])
            for i, reply in zip(group, replies, strict=True):
                tokens[i] = reply.tokens[-1]
    return tokens


def pred_tokens(
    kv: Any,
    tokens: Iterable[int],
    steps: int,
    stop: Iterable[int],
    choice: Choice,
    on_token: Callable[[int], Any] | None,
    stop_strings: Iterable[str] | str = (),
    stop_context: Iterable[int] = (),
    send: calls.SendText | None = None,
) -> Flow[Decoded]:
    checks.mask(choice.mask, "pred")
    steps = checks.steps(steps, "pred")
    stops = checks.token_ids(stop, "pred")
    strings = checks.stop_strings(stop_strings, "pred")
    # The text a stop string may begin in (and the text sent goes on from): the caller's, then
    # each call's tokens for the next.
    context = checks.token_ids(stop_context, "pred") if strings or send is not None else []
    out = Decoded()
    unsent_context = 0
    if send is not None:
        out.sent_text, out.unsent_text, unsent_context = "", send.pending, send.context
    pending = checks.token_ids(tokens, "pred")
    while len(out) < steps:  # one call per ``MAX_PRED_STEPS`` tokens
        step = calls.StepCall(kv, pending, steps - len(out), stops, on_token is not None, strings, context)
        if send is not None:  # each call goes on from the text the one before held back
            step = send.step(step, out.unsent_text or "", unsent_context)
            unsent_context = 0
        *head, last = step.calls(choice.then(step.seed(choice.seed, len(out))))
        for call in head:  # the prompt's chunks: their chosen tokens are not read
            _ = yield call
        relay = TokenRelay(on_token)
        reply: Predicted = yield (Streamed(last, relay) if on_token is not None else last)
        chosen = relay.rest(reply)
        out.extend(chosen)
        out.stop_string = reply.stop_string
        if send is not None:
            out.sent_text = (out.sent_text or "") + (reply.sent_text or "")
            out.unsent_text = reply.unsent_text or ""
        if step.ended(reply):
            break
        pending = [chosen[-1]]
        if strings or send is not None:
            context = (context + chosen)[-protocol.MAX_STOP_CONTEXT_TOKENS :]
    return out


def generate(
    kv: Any,
    prompt: Iterable[int],
    max_tokens: int,
    choice: Choice,
    grammar: Any,
    stop: Iterable[int] | None,
    eos_token_ids: Sequence[int],
    stop_strings: Iterable[str] | str = (),
) -> Flow[Decoded]:
    """``generate``'s contract (``api.Session.generate``). ``grammar``: None, a grammar state
    to go on from (its ``finished`` is set when the decode ends at the grammar's end) or a
    compiled grammar, from which a fresh state is made."""
    stops = set(eos_token_ids if stop is None else stop)
    eos = set(eos_token_ids)
    state = grammar if isinstance(grammar, GrammarStateHandle) else None
    mask_id: int | None = None if state is None else state.id
    if isinstance(grammar, GrammarHandle):
        mask_id = yield calls.grammar_state(grammar)
    elif grammar is not None and state is None:
        kind = type(grammar).__name__
        raise InvalidArgument(f"grammar= takes a Grammar or a GrammarState, not {kind}", op="generate")
    # The worker advances the state by each token it chooses. A grammar allows EOS only once the
    # output is complete, and accepting it ends the grammar (its stop tokens are the tokenizer's
    # EOS): it ends the decode too.
    mask = None if mask_id is None else calls.Advancing(mask_id)
    ends = stops | eos if mask is not None else stops
    pending = checks.token_ids(prompt, "generate")
    if max_tokens <= 0:
        return Decoded()
    if not pending:
        pending = yield from _reopen_last_token(kv)
    decode = Choice(choice.temperature, choice.top_p, choice.top_k, choice.seed, mask)
    out = yield from pred_tokens(kv, pending, max_tokens, sorted(ends), decode, None, stop_strings)
    if out.stop_string is None and out[-1] in ends:
        if state is not None and out[-1] in eos:
            state.finished = True
        if out[-1] in stops:  # not returned; every token before it is in the file already
            out.pop()
            return out
    # The last token, so kv holds prompt + output; its Dist is not wanted.
    ids = yield from pred(kv, out[-1:], None)
    yield calls.dist_release(ids.kept)
    return out


def _reopen_last_token(kv: Any) -> Flow[list[int]]:
    """Drop the file's last token and return it, so a ``pred`` of it yields the next token's
    distribution (the file keeps its tokens; one position is recomputed)."""
    n = yield calls.kv_len(kv)
    if n == 0:
        raise InvalidArgument("generate needs a prompt or a file that already holds tokens", op="generate")
    file_tokens: list[int] = yield calls.kv_tokens(kv)
    yield calls.kv_truncate(kv, n - 1)
    return file_tokens[-1:]
