"""Constrained decoding with xgrammar: grammars compiled once per source, matchers per session.

``grammar`` compiles a JSON schema, regex or EBNF grammar (cached across sessions by source
text, since compiling costs milliseconds to seconds); ``grammar_state`` makes a fresh matcher,
used as ``mask`` in ``dist_sample``/``dist_argmax`` and a fused ``pred``'s ``then``;
``mask_advance`` feeds it the chosen token, or the choice does (``advance: true``).
"""

from __future__ import annotations

import itertools
import json
import threading
from collections import OrderedDict
from typing import Any

import numpy as np
import torch

from gpu_worker import dists
from gpu_worker.protocol import ErrorCode, ProtocolError

MAX_SOURCE_CHARS = 100_000
CACHE_SIZE = 128


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


class GrammarCompiler:
    """Worker-wide compiler with an LRU cache keyed by ``(kind, source)``."""

    def __init__(self, model_dir: str, vocab_size: int) -> None:
        self._model_dir = model_dir
        self.vocab_size = vocab_size
        self._compiler: Any = None
        self._cache: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._lock = threading.Lock()
        self.compiled = 0
        self.hits = 0

    def _xgr_compiler(self) -> Any:
        if self._compiler is None:
            import xgrammar as xgr
            from transformers import AutoTokenizer

            hf = AutoTokenizer.from_pretrained(self._model_dir)
            info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=self.vocab_size)
            self._compiler = xgr.GrammarCompiler(info, max_threads=1)
        return self._compiler

    def compile(self, args: dict[str, Any]) -> Any:
        """Compile (or fetch from cache) the one grammar source given in ``args``."""
        kinds = [k for k in ("json_schema", "regex", "ebnf") if args.get(k) is not None]
        if len(kinds) != 1:
            raise ProtocolError(ErrorCode.BAD_ARGS, "give exactly one of json_schema, regex, ebnf")
        kind = kinds[0]
        source = grammar_source(kind, args[kind])
        key = (kind, source)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                self.hits += 1
                return self._cache[key]
            compiler = self._xgr_compiler()
            try:
                if kind == "json_schema":
                    # Compact JSON, no space after "," or ":" (what vLLM's disable_any_whitespace
                    # compiles): with any_whitespace a model may emit whitespace forever.
                    compiled = compiler.compile_json_schema(source, any_whitespace=False, separators=(",", ":"))
                elif kind == "regex":
                    compiled = compiler.compile_regex(source)
                else:
                    compiled = compiler.compile_grammar(source)
            except Exception as exc:  # xgrammar raises RuntimeError/ValueError subclasses
                raise ProtocolError(ErrorCode.BAD_ARGS, f"invalid {kind}: {str(exc)[:300]}") from None
            self._cache[key] = compiled
            self.compiled += 1
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
            return compiled


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
