"""asyncio flavour of the SDK: the same protocol, awaitable calls.

Calls share the threaded SDK's connection machinery (a reader thread resolves
:class:`concurrent.futures.Future` objects, wrapped here with :func:`asyncio.wrap_future`), so
``asyncio.gather`` over many ``pred`` calls puts them all in flight at once::

    from symphony import aio

    async def main(args):
        s = await aio.connect()
        kv = await s.kv_create()
        toks = await s.generate(kv, await s.tokenize("Hello"), max_tokens=8)
        return await s.detokenize(toks)

A LIP whose ``main`` is a coroutine function is run with :func:`asyncio.run` by the runner.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from symphony import calls, checks, flows
from symphony.calls import JSON, Call, Decoded, HttpResponse, Received, TopK, VocabInfo
from symphony.connection import Connection
from symphony.errors import ChannelClosed
from symphony.flows import Batch, Choice, Flow, Request, Streamed
from symphony.handles import GrammarHandle, GrammarStateHandle, Handle, SessionBase

T = TypeVar("T")


class AsyncDist(Handle["AsyncSession"]):
    """Awaitable twin of :class:`symphony.Dist`; release explicitly (or ``async with``)."""

    __slots__ = ()

    async def sample(
        self,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        mask: Any = None,
        bias: Mapping[int, float] | AsyncBiasVector | None = None,
    ) -> int:
        checks.mask(mask, "dist_sample")
        return await self.session._run(calls.dist_sample(self, temperature, top_p, top_k, seed, mask, bias))

    async def argmax(self, mask: Any = None, bias: Mapping[int, float] | AsyncBiasVector | None = None) -> int:
        checks.mask(mask, "dist_argmax")
        return await self.session._run(calls.dist_argmax(self, mask, bias))

    async def topk(self, k: int) -> TopK:
        return await self.session._run(calls.dist_topk(self, k))

    async def logprob(self, token_ids: Iterable[int]) -> list[float]:
        return await self.session._run(calls.dist_logprob(self, token_ids))

    async def full(self) -> list[float]:
        return await self.session._run(calls.dist_full(self))

    async def release(self) -> None:
        await self.session._run(calls.dist_release([self.id]))

    async def __aenter__(self) -> AsyncDist:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.release()


class AsyncKV(Handle["AsyncSession"]):
    """Awaitable twin of :class:`symphony.KV`."""

    __slots__ = ()

    async def pred(self, tokens: Iterable[int], positions: Sequence[int] | None = None) -> list[AsyncDist]:
        return await self.session.pred(self, tokens, positions)

    async def fork(self) -> AsyncKV:
        return await self.session.kv_fork(self)

    async def close(self) -> None:
        await self.session.kv_close(self)

    async def length(self) -> int:
        return await self.session.kv_len(self)

    async def truncate(self, n: int) -> None:
        await self.session.kv_truncate(self, n)

    async def __aenter__(self) -> AsyncKV:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncGrammar(GrammarHandle["AsyncSession"]):
    """Awaitable twin of :class:`symphony.Grammar`."""

    __slots__ = ()

    async def state(self) -> AsyncGrammarState:
        return AsyncGrammarState(self.session, await self.session._run(calls.grammar_state(self)))


class AsyncGrammarState(GrammarStateHandle["AsyncSession"]):
    """Awaitable twin of :class:`symphony.GrammarState`."""

    __slots__ = ()

    async def advance(self, token: int) -> bool:
        out = await self.session._run(calls.mask_advance(self, token))
        self.finished = out.finished
        return out.accepted


class AsyncBiasVector:
    """Awaitable twin of :class:`symphony.BiasVector` (pass it as ``bias=``)."""

    __slots__ = ("bias_id", "session")

    def __init__(self, session: AsyncSession, bias_id: int) -> None:
        self.session = session
        self.bias_id = bias_id

    async def release(self) -> None:
        await self.session._run(calls.bias_release(self))

    async def __aenter__(self) -> AsyncBiasVector:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.release()


class AsyncChannel:
    """:class:`symphony.Channel` as coroutines (the same semantics and errors)."""

    __slots__ = ("name", "session")

    def __init__(self, session: AsyncSession, name: str) -> None:
        self.session = session
        self.name = checks.channel_name(name)

    async def send(self, obj: JSON) -> None:
        await self.session._run(calls.channel_send(self.name, obj))

    async def recv(self, timeout: float | None = None) -> JSON:
        return (await self.recv_message(timeout)).data

    async def recv_message(self, timeout: float | None = None) -> Received:
        return await self.session._run(calls.channel_recv(self.name, timeout))

    async def publish(self, obj: JSON) -> int:
        return await self.session._run(calls.channel_publish(self.name, obj))

    async def subscribe(self) -> AsyncSubscription:
        return AsyncSubscription(self, await self.session._run(calls.channel_subscribe(self.name)))

    async def close(self) -> None:
        await self.session._run(calls.channel_close(self.name))


class AsyncSubscription:
    """:class:`symphony.Subscription` as coroutines; ``async for`` reads until the channel closes."""

    __slots__ = ("channel", "id")

    def __init__(self, channel: AsyncChannel, sub_id: int) -> None:
        self.channel = channel
        self.id = sub_id

    async def recv(self, timeout: float | None = None) -> JSON:
        return (await self.recv_message(timeout)).data

    async def recv_message(self, timeout: float | None = None) -> Received:
        return await self.channel.session._run(calls.channel_next(self.id, timeout))

    async def close(self) -> None:
        await self.channel.session._run(calls.channel_unsubscribe(self.id))

    def __aiter__(self) -> AsyncSubscription:
        return self

    async def __anext__(self) -> JSON:
        try:
            return await self.recv()
        except ChannelClosed:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> AsyncSubscription:
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.close()
        except ChannelClosed:
            pass


class AsyncChild(Handle["AsyncSession"]):
    """A child run this run spawned (:meth:`AsyncSession.spawn`); see ``symphony.Child``."""

    __slots__ = ()

    async def wait(self, timeout: float | None = None) -> JSON:
        return await self.session._run(calls.child_wait(self.id, timeout))

    async def cancel(self) -> bool:
        return await self.session._run(calls.child_cancel(self.id))


async def connect(path: str | None = None, token: str | None = None) -> AsyncSession:
    """Open a session connection (default: ``SYMPHONY_SOCKET`` / ``SYMPHONY_TOKEN``)."""
    conn = await asyncio.to_thread(Connection.open, path, token)
    return AsyncSession(conn)


class AsyncSession(SessionBase):
    """All system calls of one run as coroutines."""

    async def _run(self, call: Call[T]) -> T:
        return call.parse(await asyncio.wrap_future(self.conn.submit(call.op, call.args)))

    async def _drive(self, flow: Flow[T]) -> T:
        """Run a flow (``flows.py``) to its result, awaiting each request's reply."""
        try:
            request = next(flow)
            while True:
                request = flow.send(await self._perform(request))
        except StopIteration as done:
            return done.value

    async def _perform(self, request: Request) -> Any:
        if isinstance(request, Batch):  # every call in flight at once
            return list(await asyncio.gather(*(self._run(call) for call in request.calls)))
        if isinstance(request, Streamed):
            loop, relay = asyncio.get_running_loop(), request.relay

            def more(value: dict[str, Any]) -> None:
                # On the reader thread; the reply's own wake-up is queued after these.
                loop.call_soon_threadsafe(relay.more, value)

            call = request.call
            return call.parse(await asyncio.wrap_future(self.conn.submit(call.op, call.args, on_more=more)))
        return await self._run(request)

    async def pred(
        self, kv: AsyncKV | int, tokens: Iterable[int], positions: Sequence[int] | None = None
    ) -> list[AsyncDist]:
        ids = await self._drive(flows.pred(kv, tokens, positions))
        if ids.dropped:
            await self._run(calls.dist_release(ids.dropped))
        return [AsyncDist(self, d) for d in ids.kept]

    async def pred_token(
        self,
        kv: AsyncKV | int,
        tokens: Iterable[int],
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        mask: Any = None,
        bias: Mapping[int, float] | AsyncBiasVector | None = None,
    ) -> int:
        return await self._drive(flows.pred_token(kv, tokens, Choice(temperature, top_p, top_k, seed, mask, bias)))

    async def pred_token_many(
        self,
        steps: Sequence[tuple[AsyncKV | int, Iterable[int]]],
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        mask: Any = None,
        bias: Mapping[int, float] | AsyncBiasVector | None = None,
    ) -> list[int]:
        """Same contract as :meth:`symphony.Session.pred_token_many`; here each write's calls are
        gathered (the asyncio flavour keeps every call in flight anyway)."""
        choice = Choice(temperature, top_p, top_k, seed, mask, bias)
        return await self._drive(flows.pred_token_many(steps, choice, self.conn.admission.cap))

    async def pred_tokens(
        self,
        kv: AsyncKV | int,
        tokens: Iterable[int],
        steps: int,
        *,
        stop: Iterable[int] = (),
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        mask: Any = None,
        bias: Mapping[int, float] | AsyncBiasVector | None = None,
        on_token: Callable[[int], None] | None = None,
        stop_strings: Iterable[str] | str = (),
        stop_context: Iterable[int] = (),
        send_text: Mapping[str, Any] | None = None,
        send_pending: str = "",
        send_context: int = 0,
    ) -> Decoded:
        """Same contract as :meth:`symphony.Session.pred_tokens` (``stop_strings`` and
        ``send_text`` too: use them rather than detokenising and sending each token); ``on_token``
        runs on this event loop, before this returns."""
        choice = Choice(temperature, top_p, top_k, seed, mask, bias)
        send = calls.send_text(send_text, send_pending, send_context, "pred")
        flow = flows.pred_tokens(kv, tokens, steps, stop, choice, on_token, stop_strings, stop_context, send)
        return await self._drive(flow)

    async def generate(
        self,
        kv: AsyncKV | int,
        prompt: Iterable[int],
        max_tokens: int,
        *,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        grammar: AsyncGrammar | AsyncGrammarState | None = None,
        stop: Iterable[int] | None = None,
        stop_strings: Iterable[str] | str = (),
    ) -> Decoded:
        """Same contract as :meth:`symphony.Session.generate` (``stop_strings`` included)."""
        choice = Choice(temperature, top_p, top_k, seed)
        eos = self.info.eos_token_ids
        return await self._drive(flows.generate(kv, prompt, max_tokens, choice, grammar, stop, eos, stop_strings))

    async def release(self, dists: Iterable[AsyncDist]) -> None:
        ds = list(dists)
        if ds:
            await self._run(calls.dist_release(ds))

    async def kv_create(self, name: str | None = None, cache: bool = True, durable: bool = True) -> AsyncKV:
        return AsyncKV(self, await self._run(calls.kv_create(name, cache, durable)))

    async def kv_open(self, name: str, mode: str = "r") -> AsyncKV:
        return AsyncKV(self, await self._run(calls.kv_open(checks.file_name(name, "kv_open"), mode)))

    async def kv_fork(self, kv: AsyncKV | int) -> AsyncKV:
        return AsyncKV(self, await self._run(calls.kv_fork(kv)))

    async def kv_close(self, kv: AsyncKV | int) -> None:
        await self._run(calls.kv_close(kv))

    async def kv_remove(self, name: str) -> None:
        await self._run(calls.kv_remove(checks.file_name(name, "kv_remove")))

    async def kv_len(self, kv: AsyncKV | int) -> int:
        return await self._run(calls.kv_len(kv))

    async def kv_tokens(self, kv: AsyncKV | int) -> list[int]:
        return await self._run(calls.kv_tokens(kv))

    async def kv_truncate(self, kv: AsyncKV | int, n: int) -> None:
        await self._run(calls.kv_truncate(kv, n))

    async def kv_extract(self, kv: AsyncKV | int, start: int, end: int) -> AsyncKV:
        return AsyncKV(self, await self._run(calls.kv_extract(kv, start, end)))

    async def kv_merge(self, a: AsyncKV | int, b: AsyncKV | int) -> AsyncKV:
        return AsyncKV(self, await self._run(calls.kv_merge(a, b)))

    async def kv_pin(self, name: str, pinned: bool = True) -> None:
        await self._run(calls.kv_pin(checks.file_name(name, "kv_pin"), pinned))

    async def tokenize(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return await self._run(calls.tokenize(text, add_special_tokens))

    async def detokenize(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        return await self._run(calls.detokenize(ids, skip_special_tokens))

    async def vocab_info(self) -> VocabInfo:
        return await self._run(calls.vocab_info())

    async def apply_chat_template(
        self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True
    ) -> list[int]:
        return await self._run(calls.apply_chat_template(messages, add_generation_prompt))

    async def send_to_user(self, data: JSON) -> None:
        await self._run(calls.send_to_user(data))

    async def http_fetch(
        self,
        url: str,
        method: str = "GET",
        headers: Mapping[str, str] | None = None,
        body: bytes | str | None = None,
        timeout: float | None = None,
    ) -> HttpResponse:
        return await self._run(calls.http_fetch(url, method, headers, body, timeout))

    async def sleep(self, seconds: float) -> None:
        await self._run(calls.sleep(seconds))

    async def grammar(
        self, json_schema: Any = None, *, regex: str | None = None, ebnf: str | None = None
    ) -> AsyncGrammar:
        return AsyncGrammar(self, await self._run(calls.grammar(json_schema, regex, ebnf)))

    def channel(self, name: str) -> AsyncChannel:
        """The channel ``name`` of this run's tree (:meth:`symphony.Session.channel`)."""
        return AsyncChannel(self, name)

    async def bias_set(self, ids: Iterable[int], value: float) -> AsyncBiasVector:
        return AsyncBiasVector(self, await self._run(calls.bias_set(ids, value, self.info.vocab_size)))

    async def bias_vector(self, values: Sequence[float]) -> AsyncBiasVector:
        return AsyncBiasVector(self, await self._run(calls.bias_vector(values, self.info.vocab_size)))

    async def spawn(
        self, entry: str | None, args: JSON = None, *, limits: Mapping[str, Any] | None = None
    ) -> AsyncChild:
        """Start ``entry`` of this program as a child run (see ``symphony.spawn``)."""
        return AsyncChild(self, await self._run(calls.spawn(entry, args, limits)))


__all__ = [
    "AsyncBiasVector",
    "AsyncChannel",
    "AsyncChild",
    "AsyncDist",
    "AsyncGrammar",
    "AsyncGrammarState",
    "AsyncKV",
    "AsyncSession",
    "AsyncSubscription",
    "connect",
]
