"""Validators shared by the REST and OpenAI serializers."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from typing import overload

from rest_framework import serializers

NUL = "\x00"
#: How deeply arrays and objects may nest in any JSON the API accepts. Python's json module and
#: every recursive walk after it (these validators, DRF, the jsonb encoder) recurse per level, so
#: a 5,000-deep body would end in a RecursionError (a 500); no real request nests this deep.
MAX_JSON_DEPTH = 64
#: A UTF-16 surrogate code point alone in a Python string (JSON's ``\ud800`` escapes make them):
#: not encodable as UTF-8, so PostgreSQL cannot store it.
SURROGATE = re.compile("[\ud800-\udfff]")


def json_depth(value: object, limit: int = MAX_JSON_DEPTH) -> int:
    """How deeply ``value``'s arrays and objects nest (a scalar is 0), counted without recursion
    and stopping once past ``limit`` (so the answer is at most ``limit + 1``)."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list | tuple):
            depth += 1
            deepest = max(deepest, depth)
            if deepest > limit:
                return deepest
            stack.extend((child, depth) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def _leaves(value: object) -> Iterator[object]:
    """Every key and scalar of a JSON value, depth first."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from _leaves(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _leaves(item)
    else:
        yield value


def contains_nul(value: object) -> bool:
    """Whether a JSON value has U+0000 in any string, keys included."""
    return any(isinstance(leaf, str) and NUL in leaf for leaf in _leaves(value))


def reject_nul(value: object) -> object:
    """A serializer validator: PostgreSQL's ``jsonb`` and ``text`` cannot store U+0000, so a
    request carrying one is refused here with a 400 instead of failing at the database."""
    if contains_nul(value):
        raise serializers.ValidationError("NUL characters (U+0000) are not allowed in strings.")
    return value


def contains_surrogate(value: object) -> bool:
    """Whether a JSON value has a lone surrogate in any string, keys included."""
    return any(isinstance(leaf, str) and SURROGATE.search(leaf) is not None for leaf in _leaves(value))


def contains_non_finite(value: object) -> bool:
    """Whether a JSON value holds NaN or an infinity anywhere (``1e400`` parses to one)."""
    return any(isinstance(leaf, float) and not math.isfinite(leaf) for leaf in _leaves(value))


def storable_json(value: object) -> object:
    """A serializer validator for free-form JSON kept in ``jsonb`` (run args and limits, default
    args, schemas): PostgreSQL refuses U+0000, lone surrogates and non-finite numbers, which
    Python's json module reads (``NaN``, ``1e400``, ``"\\ud800"``), so they are a 400 here instead
    of a 500 there. JSON bodies are already refused at parsing (api/parsers.py); this catches
    JSON that arrives as a form field (a program's ``default_args`` in its multipart upload)."""
    if json_depth(value) > MAX_JSON_DEPTH:
        raise serializers.ValidationError(f"Arrays and objects must not nest deeper than {MAX_JSON_DEPTH} levels.")
    reject_nul(value)
    if contains_non_finite(value):
        raise serializers.ValidationError("Numbers must be finite: NaN, Infinity and out-of-range numbers aren't JSON.")
    if contains_surrogate(value):
        raise serializers.ValidationError("Strings must not hold unpaired UTF-16 surrogates (\\ud800-\\udfff).")
    return value


@overload
def make_storable(value: str) -> str: ...
@overload
def make_storable(value: object) -> object: ...
def make_storable(value: object) -> object:
    """The same JSON value with every U+0000 and lone surrogate (in strings and keys) replaced
    by U+FFFD and every non-finite number by ``null`` (as JavaScript's JSON.stringify writes NaN).

    For what a program produced (its result, error and output): the SDK refuses such results,
    but the record comes from inside the sandbox and refusing it here would lose the run's
    outcome and usage, so it is stored with the replacements, as invalid UTF-8 is."""
    if isinstance(value, str):
        return SURROGATE.sub("\ufffd", value.replace(NUL, "\ufffd"))
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {make_storable(k): make_storable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [make_storable(v) for v in value]
    return value
