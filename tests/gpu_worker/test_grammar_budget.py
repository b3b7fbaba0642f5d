"""The pre-compile checks of a grammar source against its budgets (no compiler needed)."""

from __future__ import annotations

import json

import pytest

from gpu_worker.config import GrammarConfig
from gpu_worker.grammar_budget import check_source, repetition_weight
from gpu_worker.protocol import ErrorCode, ProtocolError


@pytest.mark.parametrize(
    ("pattern", "weight"),
    [
        ("abc", 1),
        ("^[a-z]{1,20}$", 20),
        ("^([a-z]{1,20}){1,5}$", 100),
        ("^(([a-z]{1,10}){1,10}){1,5}$", 500),
        ("a{3}b{2,}", 3),
        ("[{]{5}", 5),
        (r"\{9}", 1),
        ("(?:ab){4}(c{3}){2}", 6),
        ("(a{10}|b{20}){3}", 60),
        ("x*y+z?", 1),
        ("((a{2})", 2),
    ],
)
def test_repetition_weight_multiplies_nested_bounds(pattern: str, weight: int) -> None:
    assert repetition_weight(pattern) == weight


@pytest.mark.parametrize(
    ("kind", "source", "budget_name"),
    [
        ("regex", "(a{1,30}){1,30}", "grammar_max_repeat"),
        ("json_schema", json.dumps({"type": "string", "pattern": "([a-z]{1,20}){1,20}"}), "grammar_max_repeat"),
        ("json_schema", json.dumps({"patternProperties": {"(x{99}){9}": {}}}), "grammar_max_repeat"),
        ("json_schema", json.dumps({"type": "array", "maxItems": 100000}), "grammar_max_repeat"),
        ("json_schema", "[" * 40 + "]" * 40, "grammar_max_depth"),
        ("json_schema", json.dumps({"items": {"items": {"items": {}}}}), "grammar_max_depth"),
    ],
)
def test_sources_over_budget_are_refused_naming_the_budget(kind: str, source: str, budget_name: str) -> None:
    budget = GrammarConfig(max_depth=32 if source.startswith("[") else 3)
    with pytest.raises(ProtocolError) as caught:
        check_source(kind, source, budget)
    assert caught.value.code == ErrorCode.BAD_ARGS and budget_name in caught.value.message


def test_sources_within_budget_pass() -> None:
    budget = GrammarConfig()
    check_source("regex", "^([a-z]{1,20}){1,5}$", budget)
    check_source("json_schema", json.dumps({"type": "array", "maxItems": 10, "items": {"type": "string"}}), budget)
    check_source("ebnf", 'root ::= "a"{1000}', budget)  # left to the time limit
