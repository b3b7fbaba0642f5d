"""Argument checks of the ``grammar`` op, before anything reaches json or xgrammar."""

from __future__ import annotations

import math

import pytest

from gpu_worker.grammar import MAX_SOURCE_CHARS, grammar_source
from gpu_worker.protocol import ErrorCode, ProtocolError


@pytest.mark.parametrize(
    ("kind", "value"),
    [
        ("json_schema", b""),
        ("json_schema", 3),
        ("json_schema", [{"type": "string"}]),
        ("json_schema", {"type": b"string"}),
        ("json_schema", {"maximum": math.inf}),
        ("json_schema", {"a": {1: 2, "b": 3}}),
        ("regex", b"a+"),
        ("ebnf", {"root": "x"}),
        ("regex", "a" * (MAX_SOURCE_CHARS + 1)),
    ],
)
def test_wrong_types_and_sizes_are_bad_args(kind: str, value: object) -> None:
    with pytest.raises(ProtocolError) as caught:
        grammar_source(kind, value)
    assert caught.value.code == ErrorCode.BAD_ARGS


def test_schema_objects_keep_their_key_order() -> None:
    """xgrammar writes properties in the schema's order, so the dump must not sort them."""
    assert grammar_source("json_schema", {"type": "object", "properties": {"b": {}, "a": {}}}) == (
        '{"type": "object", "properties": {"b": {}, "a": {}}}'
    )
    assert grammar_source("json_schema", True) == "true"
    assert grammar_source("regex", "[a-z]+") == "[a-z]+"
