"""Argument checks that turn an author's common slip into an error that says what to do.

Without them these slips surface deep in the stack as something unrelated: text given as
tokens is ``invalid literal for int()``, a ``KV`` handle given as a file name is a msgpack
``TypeError``, a compiled ``Grammar`` given as ``mask=`` is "no such mask handle" from the worker.
Shared by the threaded and asyncio flavours; each raises :class:`InvalidArgument`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from symphony.errors import InvalidArgument, MessageTooLarge
from symphony.wire import protocol

#: A channel name (the worker's rule, gpu_worker/channels.py ``NAME_RE``).
_CHANNEL_NAME = re.compile(protocol.CHANNEL_NAME_PATTERN)


def steps(value: Any, op: str) -> int:
    """A positive number of decode steps (``pred_tokens``, both SDK flavours)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgument(f"steps must be a positive integer, not {value!r}", op=op)
    return value


def token_ids(tokens: Any, op: str) -> list[int]:
    """``tokens`` as a list of ints; text (or bytes) is refused with a hint to tokenize it."""
    if isinstance(tokens, (str, bytes, bytearray)):
        raise InvalidArgument(
            f"tokens must be token ids, not {type(tokens).__name__}: tokenize text first (sy.tokenize(text))", op=op
        )
    if not isinstance(tokens, Iterable):
        raise InvalidArgument(f"tokens must be a list of token ids, not {type(tokens).__name__}", op=op)
    out: list[int] = []
    for t in tokens:
        if isinstance(t, bool) or not isinstance(t, int):
            raise InvalidArgument(f"tokens must be ints (token ids), got {type(t).__name__} {t!r:.40}", op=op)
        out.append(t)
    return out


def stop_strings(value: Any, op: str) -> list[str]:
    """``stop_strings`` as a list of strings (one string alone is one stop string); their number
    and lengths are the worker's to refuse (``protocol.MAX_STOP_STRINGS``)."""
    if isinstance(value, str):
        return [value]
    if not isinstance(value, Iterable) or isinstance(value, (bytes, bytearray)):
        raise InvalidArgument(f"stop_strings must be a list of strings, not {type(value).__name__}", op=op)
    out = list(value)
    for s in out:
        if not isinstance(s, str):
            raise InvalidArgument(f"stop_strings must hold strings, got {type(s).__name__} {s!r:.40}", op=op)
    return out


def mask(value: Any, op: str) -> None:
    """Refuse a compiled grammar where a matcher state belongs (``mask=grammar.state()``)."""
    if value is not None and callable(getattr(value, "state", None)) and hasattr(value, "id"):
        raise InvalidArgument(
            "mask= takes a grammar state, not the compiled grammar: pass grammar.state() "
            "(or grammar.state().advancing())",
            op=op,
        )


def file_name(name: Any, op: str) -> str:
    """A KV file name; an open handle is refused with the call that takes handles."""
    if isinstance(name, str):
        return name
    if hasattr(name, "id") and not isinstance(name, int):
        raise InvalidArgument(f"{op} takes a file name, not an open handle ({name!r}): use kv_close for handles", op=op)
    raise InvalidArgument(f"{op} takes a file name (str), not {type(name).__name__}", op=op)


def channel_name(name: Any) -> str:
    """A channel name: local to the run's tree, so no separators that would read as a path to
    another tree's channel."""
    if not isinstance(name, str):
        raise InvalidArgument(f"a channel name is a str, not {type(name).__name__}", op="channel")
    if not _CHANNEL_NAME.fullmatch(name) or name in (".", ".."):
        raise InvalidArgument(
            f"channel name {name[:140]!r} is not valid: 1-{protocol.MAX_CHANNEL_NAME_CHARS} letters, digits,"
            " '_', '.' or '-'; a name is always local to this run's tree (another tree's channels cannot be named)",
            op="channel",
        )
    return name


def json_keys(value: Any, op: str, what: str) -> Any:
    """``value`` with JSON's rules for map keys, as ``json.dumps`` applies them: an int, float,
    bool or ``None`` key becomes its JSON text (``{1: "a"}`` -> ``{"1": "a"}``).

    The wire (msgpack) carries string keys only: sent as it is, a result like ``{1: "a"}`` would
    fail the program at its very end and lose the result. Two keys that become the same string, and keys
    JSON has no text for, are refused here naming where they are (``what`` is the value's name,
    e.g. ``result``), never dropped. A value whose keys are all strings already (what a program
    streams token by token) is returned as it is, after a scan that builds nothing."""
    if not _has_other_keys(value):
        return value
    return _rewrite_keys(value, op, what)


def _has_other_keys(value: Any) -> bool:
    """Whether a map anywhere in ``value`` has a key that is not a str."""
    if isinstance(value, dict):
        return any(type(k) is not str or _has_other_keys(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(_has_other_keys(item) for item in value)
    return False


def _rewrite_keys(value: Any, op: str, what: str) -> Any:
    if isinstance(value, dict):
        if all(type(k) is str for k in value):
            return {k: _rewrite_keys(v, op, f"{what}[{k!r}]") for k, v in value.items()}
        out: dict[str, Any] = {}
        originals: dict[str, Any] = {}
        for key, item in value.items():
            text = _key_text(key, op, what)
            if text in originals:
                raise InvalidArgument(f"{what}: keys {originals[text]!r} and {key!r} are the same key in JSON", op=op)
            originals[text] = key
            out[text] = _rewrite_keys(item, op, f"{what}[{key!r}]")
        return out
    if isinstance(value, (list, tuple)):
        return [_rewrite_keys(item, op, f"{what}[{i}]") for i, item in enumerate(value)]
    return value


def _key_text(key: Any, op: str, what: str) -> str:
    if isinstance(key, str):
        return key
    if key is None or isinstance(key, (bool, int, float)):
        return json.dumps(key)  # True -> "true", None -> "null", 1.5 -> "1.5", as json.dumps does
    raise InvalidArgument(
        f"{what}: key {key!r} of type {type(key).__name__} cannot be a JSON key (use str, int, float, bool or None)",
        op=op,
    )


def channel_value(data: Any, op: str) -> Any:
    """Refuse, before it is sent, a value JSON cannot carry or one over the message bound (the
    worker checks both again); map keys follow JSON's rules (:func:`json_keys`)."""
    data = json_keys(data, op, "message")
    try:
        text = json.dumps(data, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"a channel message must be JSON data: {exc}", op=op) from None
    size = len(text.encode("utf-8"))
    if size > protocol.MAX_CHANNEL_MESSAGE_BYTES:
        raise MessageTooLarge(
            f"message of {size} bytes (as JSON) is over the {protocol.MAX_CHANNEL_MESSAGE_BYTES} a channel"
            " message may be",
            op=op,
        )
    return data
