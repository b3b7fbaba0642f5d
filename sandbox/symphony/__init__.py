"""``symphony``: the SDK a LIP (LLM inference program) uses to drive generation.

A LIP is a ``.py`` file (or a zip with a ``main`` module) defining ``main(args)``; its return
value is the run's result. Inside it, call the module-level functions below (they use one
session connection, opened lazily from ``SYMPHONY_SOCKET`` / ``SYMPHONY_TOKEN``) from any
number of threads, or use :mod:`symphony.aio` from asyncio code::

    import symphony as sy

    def main(args):
        kv = sy.kv_create()
        out = sy.generate(kv, sy.tokenize(args["prompt"]), max_tokens=32)
        return sy.detokenize(out)

See ``sandbox/README.md`` for the full reference.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from symphony.api import KV, BiasVector, Channel, Child, Dist, Grammar, GrammarState, Session, Subscription
from symphony.calls import JSON, Decoded, HttpResponse, Received, TopK, VocabInfo
from symphony.connection import Connection, SessionInfo
from symphony.errors import (
    BadFrame,
    Busy,
    ChannelClosed,
    ChannelFull,
    ChannelTimeout,
    ChildFailed,
    ConnectionLost,
    DeadlineExceeded,
    InternalError,
    InvalidArgument,
    IOFailed,
    KVExists,
    KVNotFound,
    KVPoolFull,
    MessageTooLarge,
    NoSpace,
    NotAuthenticated,
    PermissionDenied,
    QuotaExceeded,
    SendersGone,
    SymphonyError,
    TooManyChannels,
    UnknownOp,
)

_lock = threading.Lock()
_session: Session | None = None


def connect(path: str | None = None, token: str | None = None) -> Session:
    """Open a new session connection (default: from the environment) without making it the default."""
    return Session(Connection.open(path, token))


def session() -> Session:
    """The process-wide default session, connected on first use."""
    global _session
    with _lock:
        if _session is None or _session.conn.closed:
            _session = connect()
        return _session


def set_session(s: Session | None) -> None:
    """Make ``s`` the default session (tests, or a runner that connected explicitly)."""
    global _session
    with _lock:
        _session = s


def pred(kv: KV | int, tokens: Iterable[int], positions: Sequence[int] | None = None) -> list[Dist]:
    return session().pred(kv, tokens, positions)


def pred_token(kv: KV | int, tokens: Iterable[int], temperature: float = 0.0, **kw: Any) -> int:
    return session().pred_token(kv, tokens, temperature, **kw)


def pred_tokens(kv: KV | int, tokens: Iterable[int], steps: int, **kw: Any) -> Decoded:
    return session().pred_tokens(kv, tokens, steps, **kw)


def pred_token_many(steps: Sequence[tuple[KV | int, Iterable[int]]], temperature: float = 0.0, **kw: Any) -> list[int]:
    return session().pred_token_many(steps, temperature, **kw)


def generate(kv: KV | int, prompt: Iterable[int], max_tokens: int, **kw: Any) -> Decoded:
    return session().generate(kv, prompt, max_tokens, **kw)


def release(dists: Iterable[Dist]) -> None:
    session().release(dists)


def kv_create(name: str | None = None, cache: bool = True, durable: bool = True) -> KV:
    return session().kv_create(name, cache, durable)


def kv_open(name: str, mode: str = "r") -> KV:
    return session().kv_open(name, mode)


def kv_fork(kv: KV | int) -> KV:
    return session().kv_fork(kv)


def kv_close(kv: KV | int) -> None:
    session().kv_close(kv)


def kv_remove(name: str) -> None:
    session().kv_remove(name)


def kv_len(kv: KV | int) -> int:
    return session().kv_len(kv)


def kv_tokens(kv: KV | int) -> list[int]:
    return session().kv_tokens(kv)


def kv_truncate(kv: KV | int, n: int) -> None:
    session().kv_truncate(kv, n)


def kv_extract(kv: KV | int, start: int, end: int) -> KV:
    return session().kv_extract(kv, start, end)


def kv_merge(a: KV | int, b: KV | int) -> KV:
    return session().kv_merge(a, b)


def kv_pin(name: str, pinned: bool = True) -> None:
    session().kv_pin(name, pinned)


def tokenize(text: str, add_special_tokens: bool = False) -> list[int]:
    return session().tokenize(text, add_special_tokens)


def detokenize(ids: Iterable[int], skip_special_tokens: bool = False) -> str:
    return session().detokenize(ids, skip_special_tokens)


def vocab_info() -> VocabInfo:
    return session().vocab_info()


def apply_chat_template(messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True) -> list[int]:
    return session().apply_chat_template(messages, add_generation_prompt)


def send_to_user(data: JSON) -> None:
    session().send_to_user(data)


def http_fetch(
    url: str,
    method: str = "GET",
    headers: Mapping[str, str] | None = None,
    body: bytes | str | None = None,
    timeout: float | None = None,
) -> HttpResponse:
    return session().http_fetch(url, method, headers, body, timeout)


def sleep(seconds: float) -> None:
    session().sleep(seconds)


def grammar(json_schema: Any = None, *, regex: str | None = None, ebnf: str | None = None) -> Grammar:
    return session().grammar(json_schema, regex=regex, ebnf=ebnf)


def bias_set(ids: Iterable[int], value: float) -> BiasVector:
    return session().bias_set(ids, value)


def bias_vector(values: Sequence[float]) -> BiasVector:
    return session().bias_vector(values)


def channel(name: str) -> Channel:
    """The channel ``name`` shared by the runs of this run's tree (:class:`Channel`)."""
    return session().channel(name)


def spawn(entry: str | None, args: JSON = None, *, limits: Mapping[str, Any] | None = None) -> Child:
    """Start ``entry`` of this program (``module[:function]``; None: its ``main``) as a child run."""
    return session().spawn(entry, args, limits=limits)


__all__ = [
    "KV",
    "BadFrame",
    "BiasVector",
    "Busy",
    "Channel",
    "ChannelClosed",
    "ChannelFull",
    "ChannelTimeout",
    "Child",
    "ChildFailed",
    "Connection",
    "ConnectionLost",
    "DeadlineExceeded",
    "Decoded",
    "Dist",
    "Grammar",
    "GrammarState",
    "HttpResponse",
    "IOFailed",
    "InternalError",
    "InvalidArgument",
    "KVExists",
    "KVNotFound",
    "KVPoolFull",
    "MessageTooLarge",
    "NoSpace",
    "NotAuthenticated",
    "PermissionDenied",
    "QuotaExceeded",
    "Received",
    "SendersGone",
    "Session",
    "SessionInfo",
    "Subscription",
    "SymphonyError",
    "TooManyChannels",
    "TopK",
    "UnknownOp",
    "VocabInfo",
    "apply_chat_template",
    "bias_set",
    "bias_vector",
    "channel",
    "connect",
    "detokenize",
    "generate",
    "grammar",
    "http_fetch",
    "kv_close",
    "kv_create",
    "kv_extract",
    "kv_fork",
    "kv_len",
    "kv_merge",
    "kv_open",
    "kv_pin",
    "kv_remove",
    "kv_tokens",
    "kv_truncate",
    "pred",
    "pred_token",
    "pred_token_many",
    "pred_tokens",
    "release",
    "send_to_user",
    "session",
    "set_session",
    "sleep",
    "spawn",
    "tokenize",
    "vocab_info",
]
