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
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from symphony import calls
from symphony.calls import JSON, Call, HttpResponse, TopK, VocabInfo
from symphony.connection import Connection, SessionInfo


class AsyncDist:
    """Awaitable twin of :class:`symphony.Dist`; release explicitly (or ``async with``)."""

    __slots__ = ("id", "session")

    def __init__(self, session: AsyncSession, dist_id: int) -> None:
        self.session = session
        self.id = dist_id

    async def sample(
        self,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        mask: Any = None,
        bias: Mapping[int, float] | None = None,
    ) -> int:
        return await self.session._run(calls.dist_sample(self, temperature, top_p, top_k, seed, mask, bias))

    async def argmax(self, mask: Any = None, bias: Mapping[int, float] | None = None) -> int:
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


class AsyncKV:
    """Awaitable twin of :class:`symphony.KV`."""

    __slots__ = ("id", "session")

    def __init__(self, session: AsyncSession, kv_id: int) -> None:
        self.session = session
        self.id = kv_id

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


class AsyncGrammar:
    __slots__ = ("id", "session")

    def __init__(self, session: AsyncSession, grammar_id: int) -> None:
        self.session = session
        self.id = grammar_id

    async def state(self) -> AsyncGrammarState:
        return AsyncGrammarState(self.session, await self.session._run(calls.grammar_state(self)))


class AsyncGrammarState:
    __slots__ = ("finished", "id", "session")

    def __init__(self, session: AsyncSession, mask_id: int) -> None:
        self.session = session
        self.id = mask_id
        self.finished = False

    def advancing(self) -> calls.Advancing:
        """This state as ``mask=`` of a choice the worker makes (``pred_token``, ``Dist.sample``):
        the worker advances it by the chosen token, so no :meth:`advance` call follows."""
        return calls.Advancing(self.id)

    async def advance(self, token: int) -> bool:
        out = await self.session._run(calls.mask_advance(self, token))
        self.finished = bool(out["finished"])
        return bool(out["accepted"])


async def connect(path: str | None = None, token: str | None = None) -> AsyncSession:
    """Open a session connection (default: ``SYMPHONY_SOCKET`` / ``SYMPHONY_TOKEN``)."""
    conn = await asyncio.to_thread(Connection.open, path, token)
    return AsyncSession(conn)


class AsyncSession:
    """All system calls of one run as coroutines."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    @property
    def info(self) -> SessionInfo:
        assert self.conn.info is not None
        return self.conn.info

    async def _call(self, op: str, args: dict[str, Any]) -> Any:
        return await asyncio.wrap_future(self.conn.submit(op, args))

    async def _run(self, call: Call) -> Any:
        return call.parse(await self._call(call.op, call.args))

    def close(self) -> None:
        self.conn.close()

    async def pred(
        self, kv: AsyncKV | int, tokens: Iterable[int], positions: Sequence[int] | None = None
    ) -> list[AsyncDist]:
        out: list[AsyncDist] = []
        for call, keep in calls.pred_chunks(kv, tokens, positions, None):
            dists = [AsyncDist(self, d) for d in (await self._call(call.op, call.args))["dists"]]
            dropped = [d for i, d in enumerate(dists) if i not in keep]
            if dropped:
                await self._run(calls.dist_release(dropped))
            out.extend(dists[i] for i in keep)
        return out

    async def pred_token(
        self,
        kv: AsyncKV | int,
        tokens: Iterable[int],
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        mask: Any = None,
        bias: Mapping[int, float] | None = None,
    ) -> int:
        then = calls.then_choose(temperature, top_p, top_k, seed, mask, bias)
        result = None
        for call, _ in calls.pred_chunks(kv, tokens, None, then):
            result = (await self._call(call.op, call.args))["tokens"][-1]
        return int(result)

    async def pred_token_many(
        self, steps: Sequence[tuple[AsyncKV | int, Iterable[int]]], temperature: float = 0.0, **kw: Any
    ) -> list[int]:
        """Same contract as :meth:`symphony.Session.pred_token_many`; here the calls are simply
        gathered (the asyncio flavour keeps every call in flight anyway)."""
        return list(await asyncio.gather(*(self.pred_token(kv, toks, temperature, **kw) for kv, toks in steps)))

    async def generate(
        self,
        kv: AsyncKV | int,
        prompt: Iterable[int],
        max_tokens: int,
        *,
        temperature: float = 0.0,
        seed: int | None = None,
        stop: Iterable[int] | None = None,
    ) -> list[int]:
        """Same contract as :meth:`symphony.Session.generate` (without grammar)."""
        stops = set(self.info.eos_token_ids if stop is None else stop)
        out: list[int] = []
        pending = list(prompt)
        while len(out) < max_tokens:
            tok = await self.pred_token(kv, pending, temperature, seed=seed)
            if tok in stops:
                break
            out.append(tok)
            pending = [tok]
        if out:
            await self.release(await self.pred(kv, pending))
        return out

    async def release(self, dists: Iterable[AsyncDist]) -> None:
        ds = list(dists)
        if ds:
            await self._run(calls.dist_release(ds))

    async def kv_create(self, name: str | None = None) -> AsyncKV:
        return AsyncKV(self, await self._run(calls.kv_create(name)))

    async def kv_open(self, name: str, mode: str = "r") -> AsyncKV:
        return AsyncKV(self, await self._run(calls.kv_open(name, mode)))

    async def kv_fork(self, kv: AsyncKV | int) -> AsyncKV:
        return AsyncKV(self, await self._run(calls.kv_fork(kv)))

    async def kv_close(self, kv: AsyncKV | int) -> None:
        await self._run(calls.kv_close(kv))

    async def kv_remove(self, name: str) -> None:
        await self._run(calls.kv_remove(name))

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
        await self._run(calls.kv_pin(name, pinned))

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


__all__ = ["AsyncDist", "AsyncGrammar", "AsyncGrammarState", "AsyncKV", "AsyncSession", "connect"]
