"""The threaded SDK: a :class:`Session` over one :class:`Connection` and the handle types.

Every method blocks its calling thread only; other threads keep issuing calls on the same
connection, and the worker batches their ``pred`` calls together. Handles (:class:`KV`,
:class:`Dist`, :class:`Grammar`, :class:`GrammarState`) are small objects around worker-side
ids; they carry their session so ``kv.fork()`` or ``dist.sample()`` read naturally.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from symphony import calls
from symphony.calls import JSON, Call, HttpResponse, TopK, VocabInfo
from symphony.connection import Connection, SessionInfo
from symphony.wire import protocol


class Dist:
    """A next-token distribution kept in the worker (a row of logits from ``pred``).

    Sampling and masking run worker-side; only the chosen token comes back. The handle is
    released when :meth:`release` is called, when used as a context manager, or (batched with
    a later call) when the object is garbage-collected.
    """

    __slots__ = ("__weakref__", "_finalizer", "id", "session")

    def __init__(self, session: Session, dist_id: int) -> None:
        self.session = session
        self.id = dist_id
        self._finalizer = weakref.finalize(self, session.conn.deferred_releases.append, dist_id)

    def sample(
        self,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        mask: Any = None,
        bias: Mapping[int, float] | None = None,
    ) -> int:
        """Sample a token id (temperature 0 = greedy). ``mask``: a :class:`GrammarState` or a
        list of allowed token ids; ``bias``: sparse ``{token_id: logit offset}``."""
        return self.session._run(calls.dist_sample(self, temperature, top_p, top_k, seed, mask, bias))

    def argmax(self, mask: Any = None, bias: Mapping[int, float] | None = None) -> int:
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

    def __repr__(self) -> str:
        return f"Dist({self.id})"


class KV:
    """An open KV file handle (DESIGN.md §4): the tokens a sequence has seen and their cache."""

    __slots__ = ("id", "session")

    def __init__(self, session: Session, kv_id: int) -> None:
        self.session = session
        self.id = kv_id

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

    def __repr__(self) -> str:
        return f"KV({self.id})"


class Grammar:
    """A compiled constraint (JSON schema, regex or EBNF); make one :meth:`state` per sequence."""

    __slots__ = ("id", "session")

    def __init__(self, session: Session, grammar_id: int) -> None:
        self.session = session
        self.id = grammar_id

    def state(self) -> GrammarState:
        return GrammarState(self.session, self.session._run(calls.grammar_state(self)))


class GrammarState:
    """A matcher position in a grammar; pass it as ``mask=`` and :meth:`advance` it per token."""

    __slots__ = ("finished", "id", "session")

    def __init__(self, session: Session, mask_id: int) -> None:
        self.session = session
        self.id = mask_id
        self.finished = False

    def advancing(self) -> calls.Advancing:
        """This state as ``mask=`` of a choice the worker makes (``pred_token``, ``Dist.sample``):
        the worker advances it by the chosen token, so no :meth:`advance` call follows."""
        return calls.Advancing(self.id)

    def advance(self, token: int) -> bool:
        """Feed the chosen token; returns whether it was accepted. Sets :attr:`finished`."""
        out = self.session._run(calls.mask_advance(self, token))
        self.finished = bool(out["finished"])
        return bool(out["accepted"])


class Session:
    """All system calls of one run, over one thread-safe connection."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    @property
    def info(self) -> SessionInfo:
        assert self.conn.info is not None
        return self.conn.info

    def _run(self, call: Call, timeout: float | None = None) -> Any:
        return call.parse(self.conn.call(call.op, call.args, timeout))

    def close(self) -> None:
        self.conn.close()

    # --------------------------------------------------------------------------- pred
    def pred(self, kv: KV | int, tokens: Iterable[int], positions: Sequence[int] | None = None) -> list[Dist]:
        """One forward pass appending ``tokens`` to ``kv``; one :class:`Dist` per position
        (offsets into ``tokens``, negative from the end; default: the last)."""
        self.conn.flush_releases()
        out: list[Dist] = []
        for call, keep in calls.pred_chunks(kv, tokens, positions, None):
            ids = self.conn.call(call.op, call.args)["dists"]
            dists = [Dist(self, d) for d in ids]
            out.extend(dists[i] for i in keep)
        return out

    def pred_token(
        self,
        kv: KV | int,
        tokens: Iterable[int],
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        mask: Any = None,
        bias: Mapping[int, float] | None = None,
    ) -> int:
        """``pred`` + choose the next token in one round trip (greedy by default): the fast
        path of a decode loop, no Dist handle is created."""
        then = calls.then_choose(temperature, top_p, top_k, seed, mask, bias)
        result = None
        for call, _ in calls.pred_chunks(kv, tokens, None, then):
            result = self.conn.call(call.op, call.args)["tokens"][-1]
        return int(result)

    def pred_token_many(
        self,
        steps: Sequence[tuple[KV | int, Iterable[int]]],
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        mask: Any = None,
        bias: Mapping[int, float] | None = None,
    ) -> list[int]:
        """:meth:`pred_token` for several files at once: ``steps`` is ``(kv, tokens)`` pairs
        (distinct files), the result each one's next token, in order. The calls go out in one
        write and one thread reads the replies, so a LIP stepping many sequences in lock-step
        pays one round trip per step instead of one per sequence and thread (in gVisor, where
        every system call and thread wake-up traps, this is what keeps the sandbox's share of
        the gap between forwards small). They land in the same forward as separate calls would.
        The choice parameters apply to each call (a ``seed`` seeds each one alike). If a call
        fails, its error is raised once every reply of its write is in; the other files of that
        write did advance. More than ``MAX_IN_FLIGHT`` (64) files go in writes of 64."""
        then = calls.then_choose(temperature, top_p, top_k, seed, mask, bias)
        chunked = [calls.pred_chunks(kv, tokens, None, then) for kv, tokens in steps]
        tokens: list[int] = [0] * len(chunked)
        # A prompt longer than one call goes in several rounds; each file's chunks stay in order.
        # A round of more files than a connection may have in flight goes in several writes.
        cap = protocol.MAX_IN_FLIGHT
        for r in range(max((len(c) for c in chunked), default=0)):
            lanes = [i for i, c in enumerate(chunked) if r < len(c)]
            for group in (lanes[g : g + cap] for g in range(0, len(lanes), cap)):
                replies = self.conn.call_many([(chunked[i][r][0].op, chunked[i][r][0].args) for i in group])
                for i, reply in zip(group, replies, strict=True):
                    tokens[i] = int(reply["tokens"][-1])
        return tokens

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
        grammar: Grammar | None = None,
        stop: Iterable[int] | None = None,
    ) -> list[int]:
        """Decode up to ``max_tokens`` tokens after ``prompt`` into ``kv`` and return them.

        Stops at an EOS token (not returned, not appended) or, with ``grammar``, when the
        grammar is complete. The last generated token is appended to ``kv`` too, so the file
        ends up holding prompt + output.
        """
        stops = set(self.info.eos_token_ids if stop is None else stop)
        eos = set(self.info.eos_token_ids)
        state = grammar.state() if grammar is not None else None
        mask = state.advancing() if state is not None else None  # the worker advances it
        out: list[int] = []
        pending = list(prompt)
        while len(out) < max_tokens:
            tok = self.pred_token(kv, pending, temperature, top_p, top_k, seed, mask)
            # A grammar allows EOS only once the output is complete, and accepting it ends the
            # grammar (its stop tokens are the tokenizer's EOS, a subset of ``eos``).
            if state is not None and tok in eos:
                state.finished = True
            if tok in stops:
                break
            out.append(tok)
            pending = [tok]
            if state is not None and state.finished:
                break
        if out:  # make kv hold prompt + output, ready for the next turn
            self.pred(kv, pending)[0].release()
        return out

    def release(self, dists: Iterable[Dist]) -> None:
        ds = list(dists)
        for d in ds:
            d._finalizer.detach()
        if ds:
            self._run(calls.dist_release(ds))

    # ---------------------------------------------------------------------------- KVFS
    def kv_create(self, name: str | None = None) -> KV:
        """A new empty KV file; named ones are persistent (survive the run) in the tenant's namespace."""
        return KV(self, self._run(calls.kv_create(name)))

    def kv_open(self, name: str, mode: str = "r") -> KV:
        """Open a named file: ``"r"`` gives a private copy-on-write fork, ``"w"`` the exclusive writer."""
        return KV(self, self._run(calls.kv_open(name, mode)))

    def kv_fork(self, kv: KV | int) -> KV:
        """Copy-on-write fork: shares every full page, O(pages) metadata."""
        return KV(self, self._run(calls.kv_fork(kv)))

    def kv_close(self, kv: KV | int) -> None:
        self._run(calls.kv_close(kv))

    def kv_remove(self, name: str) -> None:
        self._run(calls.kv_remove(name))

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
        """A new file holding ``a``'s tokens followed by ``b``'s (``b``'s part is recomputed)."""
        return KV(self, self._run(calls.kv_merge(a, b)))

    def kv_pin(self, name: str, pinned: bool = True) -> None:
        """Pinned files are never evicted by the worker's memory-pressure policy."""
        self._run(calls.kv_pin(name, pinned))

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

    def finish(self, result: JSON, error: str | None = None) -> None:
        """Report the run's result (the runner calls this once; programs just return)."""
        self._run(calls.finish(result, error))


__all__ = ["KV", "Dist", "Grammar", "GrammarState", "HttpResponse", "Session", "TopK", "VocabInfo"]
