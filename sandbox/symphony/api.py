"""The threaded SDK: a :class:`Session` over one :class:`Connection` and the handle types.

Every method blocks its calling thread only; other threads keep issuing calls on the same
connection, and the worker batches their ``pred`` calls together. Handles (:class:`KV`,
:class:`Dist`, :class:`Grammar`, :class:`GrammarState`) are small objects around worker-side
ids; they carry their session so ``kv.fork()`` or ``dist.sample()`` read naturally.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from symphony import calls, checks, flows
from symphony.calls import JSON, Call, Decoded, HttpResponse, Received, TopK, VocabInfo
from symphony.errors import ChannelClosed
from symphony.flows import Batch, Choice, Flow, Request, Streamed
from symphony.handles import GrammarHandle, GrammarStateHandle, Handle, SessionBase

T = TypeVar("T")


class Dist(Handle["Session"]):
    """A next-token distribution kept in the worker (a row of logits from ``pred``).

    Sampling and masking run worker-side; only the chosen token comes back. The handle is
    released when :meth:`release` is called, when used as a context manager, or (batched with
    a later call) when the object is garbage-collected.
    """

    __slots__ = ("__weakref__", "_finalizer")

    def __init__(self, session: Session, dist_id: int) -> None:
        super().__init__(session, dist_id)
        self._finalizer = weakref.finalize(self, session.conn.deferred_releases.append, dist_id)

    def sample(
        self,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        mask: Any = None,
        bias: Mapping[int, float] | BiasVector | None = None,
    ) -> int:
        """Sample a token id (temperature 0 = greedy). ``mask``: a :class:`GrammarState` or a
        list of allowed token ids; ``bias``: sparse ``{token_id: logit offset}``."""
        checks.mask(mask, "dist_sample")
        return self.session._run(calls.dist_sample(self, temperature, top_p, top_k, seed, mask, bias))

    def argmax(self, mask: Any = None, bias: Mapping[int, float] | BiasVector | None = None) -> int:
        checks.mask(mask, "dist_argmax")
        return self.session._run(calls.dist_argmax(self, mask, bias))

    def topk(self, k: int) -> TopK:
        return self.session._run(calls.dist_topk(self, k))

    def logprob(self, token_ids: Iterable[int]) -> list[float]:
        """Log-probabilities of the given token ids."""
        return self.session._run(calls.dist_logprob(self, token_ids))

    def full(self) -> list[float]:
        """The whole log-probability vector (float16 on the wire: explicit opt-in, vocab-sized)."""
        return self.session._run(calls.dist_full(self))

    def release(self) -> None:
        if self._finalizer.detach() is not None:
            self.session._run(calls.dist_release([self.id]))

    def __enter__(self) -> Dist:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class KV(Handle["Session"]):
    """An open KV file handle (docs/ARCHITECTURE.md §5): the tokens a sequence has seen and their cache."""

    __slots__ = ()

    def pred(self, tokens: Iterable[int], positions: Sequence[int] | None = None) -> list[Dist]:
        return self.session.pred(self, tokens, positions)

    def fork(self) -> KV:
        return self.session.kv_fork(self)

    def close(self) -> None:
        self.session.kv_close(self)

    def __len__(self) -> int:
        return self.session.kv_len(self)

    def tokens(self) -> list[int]:
        return self.session.kv_tokens(self)

    def truncate(self, n: int) -> None:
        self.session.kv_truncate(self, n)

    def extract(self, start: int, end: int) -> KV:
        return self.session.kv_extract(self, start, end)

    def __enter__(self) -> KV:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Grammar(GrammarHandle["Session"]):
    """A compiled constraint (JSON schema, regex or EBNF); make one :meth:`state` per sequence."""

    __slots__ = ()

    def state(self) -> GrammarState:
        return GrammarState(self.session, self.session._run(calls.grammar_state(self)))


class GrammarState(GrammarStateHandle["Session"]):
    """A matcher position in a grammar; pass it as ``mask=`` and :meth:`advance` it per token."""

    __slots__ = ()

    def advance(self, token: int) -> bool:
        """Feed the chosen token; returns whether it was accepted. Sets :attr:`finished`."""
        out = self.session._run(calls.mask_advance(self, token))
        self.finished = out.finished
        return out.accepted


class BiasVector:
    """Logit offsets for the whole vocabulary, kept in the worker (``Session.bias_set``,
    ``Session.bias_vector``): pass it as ``bias=`` of any choice, as often as needed, instead
    of a sparse map (capped at 4,096 entries and sent with every call). Combines with ``mask=``.
    Counts ``vocab_size * 4`` bytes against the session's caps until :meth:`release`."""

    __slots__ = ("bias_id", "session")

    def __init__(self, session: Session, bias_id: int) -> None:
        self.session = session
        self.bias_id = bias_id

    def release(self) -> None:
        self.session._run(calls.bias_release(self))

    def __enter__(self) -> BiasVector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"BiasVector({self.bias_id})"


class Channel:
    """A named channel of this run's tree (every run of one tenant's run tree that names it shares
    it; docs/ARCHITECTURE.md "Channels"). Two ways to use it:

    * a **queue**: :meth:`send` puts a JSON value for exactly one :meth:`recv` (of any run of
      the tree, this one included), in order;
    * a **broadcast**: :meth:`publish` gives a value to every :class:`Subscription` made (with
      :meth:`subscribe`) before it, each reading them in order.

    Errors: :class:`MessageTooLarge` (over 64 KiB as JSON), :class:`ChannelFull` (a queue at its
    256 unread messages, or the tenant's unread bytes at their bound), :class:`TooManyChannels`
    (64 a tree), :class:`ChannelTimeout` (``recv``'s timeout), :class:`ChannelClosed`.
    """

    __slots__ = ("name", "session")

    def __init__(self, session: Session, name: str) -> None:
        self.session = session
        self.name = checks.channel_name(name)

    def send(self, obj: JSON) -> None:
        """Queue ``obj`` (JSON data) for one receiver; returns at once (it never waits for one)."""
        self.session._run(calls.channel_send(self.name, obj))

    def recv(self, timeout: float | None = None) -> JSON:
        """The oldest queued value, waiting up to ``timeout`` seconds (``None``: until one comes
        or the run's deadline) for one; :class:`ChannelTimeout` when none came."""
        return self.recv_message(timeout).data

    def recv_message(self, timeout: float | None = None) -> Received:
        """:meth:`recv` with the run id of the sender (``.data``, ``.sender``)."""
        return self.session._run(calls.channel_recv(self.name, timeout))

    def publish(self, obj: JSON) -> int:
        """Give ``obj`` to every current subscriber; how many it reached (0: nobody subscribed)."""
        return self.session._run(calls.channel_publish(self.name, obj))

    def subscribe(self) -> Subscription:
        """A subscription that receives every value published from now on."""
        return Subscription(self, self.session._run(calls.channel_subscribe(self.name)))

    def close(self) -> None:
        """No more values: send and publish fail from now on; readers get what is queued, then
        :class:`ChannelClosed`."""
        self.session._run(calls.channel_close(self.name))

    def __repr__(self) -> str:
        return f"Channel({self.name!r})"


class Subscription:
    """Values published on a channel after this subscription was made; iterate it to read them
    until the channel is closed. :meth:`close` (or leaving a ``with`` block) unsubscribes."""

    __slots__ = ("channel", "id")

    def __init__(self, channel: Channel, sub_id: int) -> None:
        self.channel = channel
        self.id = sub_id

    def recv(self, timeout: float | None = None) -> JSON:
        return self.recv_message(timeout).data

    def recv_message(self, timeout: float | None = None) -> Received:
        return self.channel.session._run(calls.channel_next(self.id, timeout))

    def close(self) -> None:
        self.channel.session._run(calls.channel_unsubscribe(self.id))

    def __iter__(self) -> Iterator[JSON]:
        while True:
            try:
                yield self.recv()
            except ChannelClosed:
                return

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.close()
        except ChannelClosed:
            pass

    def __repr__(self) -> str:
        return f"Subscription({self.channel.name!r}, {self.id})"


class Child(Handle["Session"]):
    """A child run this run spawned (:meth:`Session.spawn`): a run of the same tenant and
    program, on the same worker (KV files and batches shared), in its own sandbox. ``id``: the
    child run's id (``GET /api/v1/runs/<id>``)."""

    __slots__ = ()

    def wait(self, timeout: float | None = None) -> JSON:
        """Block until the child ends and return its result; raises :class:`ChildFailed` when it
        failed, timed out or was cancelled, ``DeadlineExceeded`` when ``timeout`` passed first."""
        return self.session._run(calls.child_wait(self.id, timeout))

    def cancel(self) -> bool:
        """Cancel the child and its descendants; False when it had already ended."""
        return self.session._run(calls.child_cancel(self.id))


class Session(SessionBase):
    """All system calls of one run, over one thread-safe connection."""

    def _run(self, call: Call[T], timeout: float | None = None) -> T:
        return call.parse(self.conn.call(call.op, call.args, timeout))

    def _drive(self, flow: Flow[T]) -> T:
        """Run a flow (``flows.py``) to its result, one blocking call per request."""
        try:
            request = next(flow)
            while True:
                request = flow.send(self._perform(request))
        except StopIteration as done:
            return done.value

    def _perform(self, request: Request) -> Any:
        if isinstance(request, Batch):  # one write, this thread reads every reply
            replies = self.conn.call_many([(call.op, call.args) for call in request.calls])
            return [call.parse(reply) for call, reply in zip(request.calls, replies, strict=True)]
        if isinstance(request, Streamed):
            call = request.call
            return call.parse(self.conn.call(call.op, call.args, on_more=request.relay.more))
        return self._run(request)

    # --------------------------------------------------------------------------- pred
    def pred(self, kv: KV | int, tokens: Iterable[int], positions: Sequence[int] | None = None) -> list[Dist]:
        """One forward pass appending ``tokens`` to ``kv``; one :class:`Dist` per position
        (offsets into ``tokens``, negative from the end; default: the last)."""
        self.conn.flush_releases()
        ids = self._drive(flows.pred(kv, tokens, positions))
        self.conn.deferred_releases.extend(ids.dropped)  # batched with a later call
        return [Dist(self, d) for d in ids.kept]

    def pred_token(
        self,
        kv: KV | int,
        tokens: Iterable[int],
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        mask: Any = None,
        bias: Mapping[int, float] | BiasVector | None = None,
    ) -> int:
        """``pred`` + choose the next token in one round trip (greedy by default): the fast
        path of a decode loop, no Dist handle is created."""
        return self._drive(flows.pred_token(kv, tokens, Choice(temperature, top_p, top_k, seed, mask, bias)))

    def pred_tokens(
        self,
        kv: KV | int,
        tokens: Iterable[int],
        steps: int,
        *,
        stop: Iterable[int] = (),
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        mask: Any = None,
        bias: Mapping[int, float] | BiasVector | None = None,
        on_token: Callable[[int], None] | None = None,
        stop_strings: Iterable[str] | str = (),
        stop_context: Iterable[int] = (),
        send_text: Mapping[str, Any] | None = None,
        send_pending: str = "",
        send_context: int = 0,
    ) -> Decoded:
        """:meth:`pred_token` that goes on for up to ``steps`` tokens inside the worker: each
        chosen token is appended and the next one chosen without a round trip to the program, so
        a decode loop the program need not look into between tokens costs one call, not one per
        token (the batch never waits for this program between those forwards).

        Returns the chosen tokens, ending early after a token of ``stop`` (returned last). As with
        :meth:`pred_token`, the last returned token is **not** in ``kv`` yet: pass it as the
        ``tokens`` of the next call. Fewer than ``steps`` tokens also come back when a step cannot
        run (the file at the model's context length, the run's token budget or KV limit): the next
        call then raises what stopped it. With a ``seed``, the token at step ``j`` is sampled with
        ``seed + j``; ``mask`` may be a grammar state's ``advancing()`` (the worker moves it at
        each step) or a token list; ``bias`` applies to every step.

        ``on_token(token)``: each token as soon as the worker chose it, in order, before this
        returns (for streaming). It runs on whichever thread reads the socket: keep it short and
        make no Symphony call from it; what it raises is raised here once the call is over.

        ``stop_strings`` (a string or a list of them, at most ``MAX_STOP_STRINGS`` (16) of at most
        ``MAX_STOP_STRING_CHARS`` (128) characters): the decode ends, too, at the token that makes
        the text of the tokens chosen so far contain one of them. The worker detokenises as it
        goes (as :meth:`detokenize` would, special tokens kept), so watching text costs no round
        trip per token. That token is returned last (the text past the stop is the program's to
        cut) and the result's ``stop_string`` names the string (None when the decode ended
        otherwise). ``stop_context``: tokens whose text comes before these (say, the answer's
        first token, chosen by an earlier call, whose own text the program already looked at): a
        string may begin in their text; one wholly within it is not looked for. Past
        ``MAX_PRED_STEPS`` tokens the next call watches on from the text of the ones before.

        When to use it rather than a loop of :meth:`pred_token`: whenever the program does not
        need to look at each token before the next is chosen, i.e. every step chooses alike
        (the same sampling parameters, ``bias`` and ``mask``, or a grammar state's
        ``advancing()``) and the decode ends only at a token id, a stop string, a step count or
        the limits. Each :meth:`pred_token` is a round trip between two forwards, and while the
        worker is busy the whole batch may wait for it; here the engine steps on. A loop that
        must see something else between tokens (penalties counted from the tokens so far,
        logprobs per token, a stop decided by the program's own logic) cannot hand the decision
        to the worker: it either stays per token, or takes a few tokens per call and, past a stop
        it finds, rolls the file back with :meth:`kv_truncate` (the extra tokens are still
        computed and metered).

        ``send_text`` (a JSON object, say ``{"index": 0}``): the worker sends the tokens' text to
        the run's user as they are chosen, each token's new text as ``send_to_user({**send_text,
        "delta": text})`` would (metered and bounded alike), with no round trip to this program
        per token. It holds back what one of ``stop_strings`` could still grow from and an
        incomplete character, sends nothing from the token whose text completes a string on
        (cut the text there and send the rest yourself) and no text of a ``stop`` token.
        ``send_pending``: text before these tokens' that was not sent yet (it goes out first);
        ``send_context``: the last tokens of ``stop_context`` whose text was not sent either (the
        first token, say, chosen by the prompt's ``pred_token``). The result's ``sent_text`` is
        what went out, ``unsent_text`` what was held back at the end: pass it as the next call's
        ``send_pending``, or send the final text's rest yourself. Use it to stream a decode's
        text to the user: a :meth:`detokenize` and a :meth:`send_to_user` per token are two round
        trips each, which take the worker's and this program's CPU from the decode."""
        choice = Choice(temperature, top_p, top_k, seed, mask, bias)
        send = calls.send_text(send_text, send_pending, send_context, "pred")
        flow = flows.pred_tokens(kv, tokens, steps, stop, choice, on_token, stop_strings, stop_context, send)
        return self._drive(flow)

    def pred_token_many(
        self,
        steps: Sequence[tuple[KV | int, Iterable[int]]],
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        mask: Any = None,
        bias: Mapping[int, float] | BiasVector | None = None,
    ) -> list[int]:
        """:meth:`pred_token` for several files at once: ``steps`` is ``(kv, tokens)`` pairs
        (distinct files), the result each one's next token, in order. The calls go out in one
        write and one thread reads the replies, so a LIP stepping many sequences in lock-step
        pays one round trip per step instead of one per sequence and thread (in gVisor, where
        every system call and thread wake-up traps, this is what keeps the sandbox's share of
        the gap between forwards small). They land in the same forward as separate calls would.
        The choice parameters apply to each call (a ``seed`` seeds each one alike). If a call
        fails, its error is raised once every reply of its write is in; the other files of that
        write did advance. More files than the connection may have in flight (63: the worker's 64
        less one kept for releases) go in several writes."""
        choice = Choice(temperature, top_p, top_k, seed, mask, bias)
        return self._drive(flows.pred_token_many(steps, choice, self.conn.admission.cap))

    def generate(
        self,
        kv: KV | int,
        prompt: Iterable[int],
        max_tokens: int,
        *,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        grammar: Grammar | GrammarState | None = None,
        stop: Iterable[int] | None = None,
        stop_strings: Iterable[str] | str = (),
    ) -> Decoded:
        """Decode up to ``max_tokens`` tokens after ``prompt`` into ``kv`` and return them.

        Stops at an EOS token (not returned, not appended) or, with ``grammar`` (a compiled
        :class:`Grammar`, or a :class:`GrammarState` to go on from), when the grammar is
        complete. The last generated token is appended to ``kv`` too, so the file ends up
        holding prompt + output. An empty ``prompt`` continues a file that already holds
        tokens (a prefilled fork): its last token is computed again to get the next one.
        The tokens are decoded in the worker (:meth:`pred_tokens`): one call, not one per token;
        with a ``seed``, the token at step ``j`` is sampled with ``seed + j``.

        ``stop_strings``: it stops, too, at the token that makes the output's text contain one of
        them (decided in the worker, see :meth:`pred_tokens`; use it instead of detokenising the
        output token by token). That token is returned and appended; the result's
        ``stop_string`` names the string, and the text past it is the program's to cut.
        """
        choice = Choice(temperature, top_p, top_k, seed)
        eos = self.info.eos_token_ids
        return self._drive(flows.generate(kv, prompt, max_tokens, choice, grammar, stop, eos, stop_strings))

    def release(self, dists: Iterable[Dist]) -> None:
        ds = list(dists)
        for d in ds:
            d._finalizer.detach()
        if ds:
            self._run(calls.dist_release(ds))

    # ---------------------------------------------------------------------------- KVFS
    def kv_create(self, name: str | None = None, cache: bool = True, durable: bool = True) -> KV:
        """A new empty KV file; named ones are persistent (survive the run) in the tenant's namespace.
        ``cache=False`` opts it out of the automatic prefix cache: its first ``pred`` reuses no
        cached prefix and its pages are never offered to the tenant's other files.
        ``durable=False`` (for KV the program can recompute, such as a conversation's): a named
        file's changes are not written to the KV store at every close but once it has been idle
        a while (two minutes by default), so a worker crash may lose its latest changes."""
        return KV(self, self._run(calls.kv_create(name, cache, durable)))

    def kv_open(self, name: str, mode: str = "r") -> KV:
        """Open a named file: ``"r"`` gives a private copy-on-write fork, ``"w"`` the exclusive writer."""
        return KV(self, self._run(calls.kv_open(checks.file_name(name, "kv_open"), mode)))

    def kv_fork(self, kv: KV | int) -> KV:
        """Copy-on-write fork: shares every full page, O(pages) metadata."""
        return KV(self, self._run(calls.kv_fork(kv)))

    def kv_close(self, kv: KV | int) -> None:
        self._run(calls.kv_close(kv))

    def kv_remove(self, name: str) -> None:
        self._run(calls.kv_remove(checks.file_name(name, "kv_remove")))

    def kv_len(self, kv: KV | int) -> int:
        return self._run(calls.kv_len(kv))

    def kv_tokens(self, kv: KV | int) -> list[int]:
        return self._run(calls.kv_tokens(kv))

    def kv_truncate(self, kv: KV | int, n: int) -> None:
        """Keep the first ``n`` tokens (rollback for speculative / backtracking programs)."""
        self._run(calls.kv_truncate(kv, n))

    def kv_extract(self, kv: KV | int, start: int, end: int) -> KV:
        return KV(self, self._run(calls.kv_extract(kv, start, end)))

    def kv_merge(self, a: KV | int, b: KV | int) -> KV:
        """A new file holding ``a``'s tokens followed by ``b``'s; ``b``'s part is recomputed
        with the next ``pred`` on it, and metered as that call's prefill."""
        return KV(self, self._run(calls.kv_merge(a, b)))

    def kv_pin(self, name: str, pinned: bool = True) -> None:
        """Pinned files are never evicted by the worker's memory-pressure policy."""
        self._run(calls.kv_pin(checks.file_name(name, "kv_pin"), pinned))

    # ----------------------------------------------------------------------- tokenizer
    def tokenize(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self._run(calls.tokenize(text, add_special_tokens))

    def detokenize(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        return self._run(calls.detokenize(ids, skip_special_tokens))

    def vocab_info(self) -> VocabInfo:
        return self._run(calls.vocab_info())

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True
    ) -> list[int]:
        return self._run(calls.apply_chat_template(messages, add_generation_prompt))

    # ---------------------------------------------------------------------- I/O, misc
    def send_to_user(self, data: JSON) -> None:
        """Stream text (a ``token`` event) or JSON-like data (a ``message`` event) to the client."""
        self._run(calls.send_to_user(data))

    def http_fetch(
        self,
        url: str,
        method: str = "GET",
        headers: Mapping[str, str] | None = None,
        body: bytes | str | None = None,
        timeout: float | None = None,
    ) -> HttpResponse:
        """Brokered HTTP: the worker performs it against the run's host allowlist."""
        return self._run(calls.http_fetch(url, method, headers, body, timeout))

    def sleep(self, seconds: float) -> None:
        """Wait in the worker (the LIP's private KV pages may be swapped out meanwhile)."""
        self._run(calls.sleep(seconds))

    def grammar(self, json_schema: Any = None, *, regex: str | None = None, ebnf: str | None = None) -> Grammar:
        """Compile a constraint once; use ``grammar.state()`` as ``mask=`` when sampling."""
        return Grammar(self, self._run(calls.grammar(json_schema, regex, ebnf)))

    def bias_set(self, ids: Iterable[int], value: float) -> BiasVector:
        """A worker-side bias adding ``value`` to the logit of each of ``ids`` (a token set of
        any size, e.g. half the vocabulary; a large negative ``value`` all but bans them)."""
        return BiasVector(self, self._run(calls.bias_set(ids, value, self.info.vocab_size)))

    def bias_vector(self, values: Sequence[float]) -> BiasVector:
        """A worker-side bias of one offset per token (``len(values) == vocab_size``)."""
        return BiasVector(self, self._run(calls.bias_vector(values, self.info.vocab_size)))

    # ------------------------------------------------------------------------- channels
    def channel(self, name: str) -> Channel:
        """The channel ``name`` of this run's tree (made on first use by any run of the tree)."""
        return Channel(self, name)

    def spawn(self, entry: str | None, args: JSON = None, *, limits: Mapping[str, Any] | None = None) -> Child:
        """Start ``entry`` (``module[:function]`` of this program's bundle; None or "self": the
        program's own ``main``) as a child run with ``args``; refused at once (``QuotaExceeded``)
        past the plan's children per run, tree depth or concurrent runs."""
        return Child(self, self._run(calls.spawn(entry, args, limits)))

    def finish(self, result: JSON, error: str | None = None) -> None:
        """Report the run's result (the runner calls this once; programs just return)."""
        self._run(calls.finish(result, error))


__all__ = [
    "KV",
    "BiasVector",
    "Child",
    "Dist",
    "Grammar",
    "GrammarState",
    "HttpResponse",
    "Session",
    "TopK",
    "VocabInfo",
]
