"""Constrained decoding with xgrammar: grammars compiled once per source, matchers per session.

``grammar`` compiles a JSON schema, regex or EBNF grammar (cached across sessions by source
text, since compiling costs milliseconds to seconds; compiled in child processes under a time
and size budget, so a hostile source costs only a child); ``grammar_state`` makes a fresh matcher,
used as ``mask`` in ``dist_sample``/``dist_argmax`` and a fused ``pred``'s ``then``;
``mask_advance`` feeds it the chosen token, or the choice does (``advance: true``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gpu_worker import dists
from gpu_worker.config import GrammarConfig
from gpu_worker.grammar_backoff import CompileBackoff
from gpu_worker.grammar_budget import check_source
from gpu_worker.grammar_pool import CompilePool, CompileTimeout
from gpu_worker.protocol import ErrorCode, ProtocolError
from gpu_worker.protocol import Grammar as GrammarArgs

MAX_SOURCE_CHARS = 100_000
CACHE_SIZE = 128
#: How long a compile that ran out of time stays refused without trying again.
REFUSAL_TTL_S = 60.0


def grammar_source(kind: str, value: object) -> str:
    """The source text to compile, or BAD_ARGS for a value of the wrong type or size.

    A JSON schema may come as text or as the decoded schema (an object or a boolean schema);
    anything else a LIP sends (bytes, numbers, objects holding bytes) is refused here, before
    it can reach ``json.dumps`` or xgrammar.
    """
    if kind == "json_schema" and isinstance(value, (dict, bool)):
        try:
            # Key order kept: xgrammar emits an object's properties in the schema's order, so a
            # sorted dump would change what the model writes (and disagree with the schema text).
            text = json.dumps(value, allow_nan=False)
            # json.dumps turns a non-string key into a string; JSON has only string keys.
            if json.loads(text) != value:
                raise ValueError("object keys must be strings")
            value = text
        except (TypeError, ValueError, RecursionError) as exc:
            raise ProtocolError(ErrorCode.BAD_ARGS, f"json_schema is not JSON: {exc}") from None
    if not isinstance(value, str) or len(value) > MAX_SOURCE_CHARS:
        what = "a string or a JSON schema object" if kind == "json_schema" else "a string"
        raise ProtocolError(ErrorCode.BAD_ARGS, f"{kind} must be {what} of at most {MAX_SOURCE_CHARS} chars")
    return value


def model_vocab_size(model_dir: str) -> int:
    """The vocabulary size the checkpoint's ``config.json`` declares (a multimodal model's text
    part), as vLLM's model config reads it, known before the engine is built."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
        return int(config.get("text_config", {}).get("vocab_size") or config["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0  # unknown: the worker starts the compiler again once the engine says


class GrammarCompiler:
    """Worker-wide LRU of compiled grammars keyed by ``(kind, source)``, compiled in child
    processes (``grammar_pool``) under the worker's grammar budgets.

    Everything but the compile itself runs on the event loop: a cache hit returns at once and
    never waits for anyone's compile; concurrent requests for one source share one compile; an
    *account* (a person's tenants together) compiles in at most the pool's ceiling of the
    children at once, and a waiting account that holds none goes first (``grammar_pool``), so
    another account always finds one soon. Refusals are remembered too (a timeout only for ``REFUSAL_TTL_S``, since load
    may have caused it), so resubmitting a hostile source does not cost another child; a timeout
    also refuses the account's next first-time compiles for a back-off (``grammar_backoff``), so
    a stream of never-seen hostile sources does not keep a child busy either. A back-off refusal
    is load, not the source: it is not remembered.
    """

    def __init__(self, model_dir: str, vocab_size: int, budget: GrammarConfig | None = None) -> None:
        self._model_dir = model_dir
        self.vocab_size = vocab_size
        self.budget = budget or GrammarConfig()
        self._info: Any = None
        self._pool: CompilePool | None = None
        self._starting: asyncio.Future[None] | None = None
        self._cache: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._inflight: dict[tuple[str, str], asyncio.Task] = {}
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="grammar")
        self.compiled = 0
        self.hits = 0
        self.refused = 0

    async def start(self) -> None:
        """Load the tokenizer's vocabulary for xgrammar and start the compiling children (a
        worker that answers health can compile at once). The worker begins this before it
        builds the engine and awaits it before it answers (``gpu_worker.__main__``): the
        children's start-up runs on the other core while the engine loads; a second call awaits
        the first one's work."""
        if self._starting is None:
            self._starting = asyncio.ensure_future(self._start())
        await asyncio.shield(self._starting)

    async def _start(self) -> None:
        loop = asyncio.get_running_loop()
        self._info = await loop.run_in_executor(self._thread, self._tokenizer_info)
        serialized = await loop.run_in_executor(self._thread, self._info.serialize_json)
        backoff = CompileBackoff(self.budget.kill_backoff_s, self.budget.kill_backoff_max_s)
        self._pool = CompilePool(serialized, self.budget.processes, self.budget.max_bytes, backoff)
        await self._pool.start()

    def _tokenizer_info(self) -> Any:
        import xgrammar as xgr
        from transformers import AutoTokenizer

        hf = AutoTokenizer.from_pretrained(self._model_dir)
        return xgr.TokenizerInfo.from_huggingface(hf, vocab_size=self.vocab_size)

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
        self._thread.shutdown(wait=False)

    def stats(self) -> dict[str, int]:
        pool = self._pool
        return {
            "compiled": self.compiled,
            "cache_hits": self.hits,
            "refused": self.refused,
            "killed": pool.killed if pool is not None else 0,
            "backoff_refused": pool.backoff.refused if pool is not None else 0,
            "idle_children": pool.idle if pool is not None else 0,
        }

    async def compile(self, args: GrammarArgs, account: str) -> Any:
        """The compiled grammar of the one source ``args`` gives (cached), or BAD_ARGS; a compile
        counts against ``account`` (``WorkerSession.account``)."""
        ((kind, given),) = [(k, v) for k, v in vars(args).items() if v is not None]
        source = grammar_source(kind, given)
        key = (kind, source)
        cached = self._cached(key)
        if cached is not None:
            return cached
        check_source(kind, source, self.budget)
        task = self._inflight.get(key)
        if task is None:
            if self._pool is None:
                raise ProtocolError(ErrorCode.INTERNAL, "grammar compiler is not started")
            task = asyncio.get_running_loop().create_task(self._compile(key, account))
            self._inflight[key] = task
            task.add_done_callback(partial(self._compiled, key))
        # Shielded: one requester going away must not cancel the compile the others share.
        return await asyncio.shield(task)

    def _compiled(self, key: tuple[str, str], task: asyncio.Task) -> None:
        del self._inflight[key]
        if not task.cancelled():
            task.exception()  # retrieved here: every requester may have gone away

    def _cached(self, key: tuple[str, str]) -> Any:
        entry = self._cache.get(key)
        if entry is None:
            return None
        if isinstance(entry, _Refusal):
            if entry.expires_at is not None and time.monotonic() > entry.expires_at:
                del self._cache[key]
                return None
            self._cache.move_to_end(key)
            raise ProtocolError(entry.error.code, entry.error.message)
        self._cache.move_to_end(key)
        self.hits += 1
        return entry

    def _remember(self, key: tuple[str, str], value: Any) -> None:
        self._cache[key] = value
        while len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)

    async def _compile(self, key: tuple[str, str], account: str) -> Any:
        kind, source = key
        assert self._pool is not None
        reply: dict[str, Any] | None = None
        # The refusal is raised outside the pool's slot: contextlib sets attributes on what
        # passes through, and a ProtocolError is frozen.
        with contextlib.suppress(CompileTimeout):
            reply = await self._pool.compile(kind, source, self.budget.timeout_s, account)
        if reply is None:
            error = ProtocolError(
                ErrorCode.BAD_ARGS,
                f"{kind} did not compile within the grammar budget of {self.budget.timeout_s:g} s "
                "(grammar_compile_timeout_s)",
            )
            return self._refuse(key, error, time.monotonic() + REFUSAL_TTL_S)
        if "err" in reply:
            return self._refuse(key, ProtocolError(ErrorCode.BAD_ARGS, str(reply["err"])), None)
        import xgrammar as xgr

        compiled = await asyncio.get_running_loop().run_in_executor(
            self._thread, xgr.CompiledGrammar.deserialize_json, reply["ok"], self._info
        )
        self._remember(key, compiled)
        self.compiled += 1
        return compiled

    def _refuse(self, key: tuple[str, str], error: ProtocolError, expires_at: float | None) -> Any:
        self.refused += 1
        self._remember(key, _Refusal(error, expires_at))
        raise error


@dataclass(frozen=True)
class _Refusal:
    error: ProtocolError
    expires_at: float | None


class Matcher:
    """One grammar state: which tokens may come next, advanced token by token."""

    def __init__(self, compiled: Any, vocab_size: int) -> None:
        import xgrammar as xgr

        self._matcher = xgr.GrammarMatcher(compiled)
        self._bitmask = xgr.allocate_token_bitmask(1, vocab_size)
        self.vocab_size = vocab_size
        # A fused pred restricts (and may advance) on the engine thread while the event loop
        # may run this state's mask_advance: one native matcher must not see both at once.
        self._lock = threading.Lock()

    def restrict(self, logits: torch.Tensor) -> torch.Tensor:
        """A copy of ``logits`` with every token the grammar forbids set to -inf."""
        with self._lock:
            if self._matcher.is_terminated():
                raise ProtocolError(ErrorCode.BAD_ARGS, "grammar state is finished; no token may follow")
            self._matcher.fill_next_token_bitmask(self._bitmask)
            allowed = self._allowed_tokens()
        return dists.restrict(logits, allowed)

    def _allowed_tokens(self) -> np.ndarray:
        """The last filled bitmask as one bool per token: bit ``i`` of int32 word ``j`` is token
        ``32 * j + i``, so the words' bytes unpack little-endian (as on x86 and ARM)."""
        words = self._bitmask.numpy().view(np.uint8)
        return np.unpackbits(words, bitorder="little", count=self.vocab_size).view(np.bool_)

    def advance(self, token: object) -> dict[str, bool]:
        if not isinstance(token, int) or isinstance(token, bool) or not 0 <= token < self.vocab_size:
            raise ProtocolError(ErrorCode.BAD_ARGS, "token must be an integer in [0, vocab_size)")
        with self._lock:
            if self._matcher.is_terminated():
                return {"accepted": False, "finished": True}
            accepted = bool(self._matcher.accept_token(token))
            return {"accepted": accepted, "finished": bool(self._matcher.is_terminated())}


class GrammarHandles:
    """A session's grammar and matcher handles (bounded)."""

    def __init__(self, limit: int = 1024) -> None:
        self.limit = limit
        self.grammars: dict[int, Any] = {}
        self.matchers: dict[int, Matcher] = {}
        self._ids = itertools.count(1)

    def add_grammar(self, compiled: Any) -> int:
        return self._add(self.grammars, compiled)

    def add_matcher(self, matcher: Matcher) -> int:
        return self._add(self.matchers, matcher)

    def _add(self, table: dict[int, Any], value: Any) -> int:
        if len(self.grammars) + len(self.matchers) >= self.limit:
            raise ProtocolError(ErrorCode.NO_SPACE, f"too many grammar handles (limit {self.limit})")
        hid = next(self._ids)
        table[hid] = value
        return hid

    def grammar(self, hid: object) -> Any:
        return self._get(self.grammars, hid, "grammar")

    def matcher(self, hid: object) -> Matcher:
        return self._get(self.matchers, hid, "mask")

    @staticmethod
    def _get(table: dict[int, Any], hid: object, what: str) -> Any:
        if not isinstance(hid, int) or isinstance(hid, bool) or hid not in table:
            raise ProtocolError(ErrorCode.NOT_FOUND, f"no such {what} handle {hid!r}")
        return table[hid]
