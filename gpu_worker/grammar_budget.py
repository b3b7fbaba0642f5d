"""Checks of a grammar source against its budgets before anything compiles it.

xgrammar expands a bounded repetition into copies of what it repeats, so nested bounds multiply:
``^(([a-z]{1,10}){1,10}){1,5}$`` (500 copies) took 42 s to compile on a 2-core CPU, holding a
core. The compile time limit (``grammar_pool``) catches what slips through; these checks refuse
the obvious cases at once, with an error that names the budget, before a child process is spent.
"""

from __future__ import annotations

import json
import re
from typing import Any

from gpu_worker.config import GrammarConfig
from gpu_worker.protocol import ErrorCode, ProtocolError

_QUANTIFIER = re.compile(r"\{(\d+)(,(\d*))?\}")
#: Schema keywords whose count xgrammar unrolls like a regex repetition.
_COUNT_KEYWORDS = ("minItems", "maxItems", "minProperties", "maxProperties")


def repetition_weight(pattern: str) -> int:
    """The largest product of nested repetition bounds in ``pattern`` (1 for none).

    ``{m,n}`` counts n, ``{m}`` and ``{m,}`` count m; ``*``, ``+`` and ``?`` are loops, not
    copies, and count 1. Escapes and character classes are skipped; an unbalanced pattern is
    measured as far as it goes (xgrammar then refuses it).
    """
    frames = [1]  # per open group: the heaviest element so far
    last = 0  # weight of the element a quantifier would apply to
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            i += 2
            last = 1
        elif c == "[":
            i = _class_end(pattern, i)
            last = 1
        elif c == "(":
            frames.append(1)  # a group's "?:" or "?P<name>" counts as literals: weight 1
            last = 0
            i += 1
            continue
        elif c == ")":
            last = frames.pop() if len(frames) > 1 else 1
            i += 1
        elif c == "{" and (m := _QUANTIFIER.match(pattern, i)) and last:
            bound = int(m.group(3)) if m.group(3) else int(m.group(1))
            last = last * max(bound, 1)
            i = m.end()
        else:
            last = 1
            i += 1
        frames[-1] = max(frames[-1], last)
    return max(frames)


def _class_end(pattern: str, start: int) -> int:
    """Index just past the character class opened at ``start``."""
    i = start + 1
    if pattern.startswith("^", i):
        i += 1
    if pattern.startswith("]", i):
        i += 1
    while i < len(pattern) and pattern[i] != "]":
        i += 2 if pattern[i] == "\\" else 1
    return i + 1


def check_regex(pattern: str, budget: GrammarConfig, where: str = "regex") -> None:
    """BAD_ARGS naming the budget when ``pattern`` repeats more than it allows."""
    weight = repetition_weight(pattern)
    if weight > budget.max_repeat:
        raise ProtocolError(
            ErrorCode.BAD_ARGS,
            f"{where} nests repetitions to {weight} copies, over the grammar budget of "
            f"{budget.max_repeat} (grammar_max_repeat)",
        )


def check_json_schema(source: str, budget: GrammarConfig) -> None:
    """BAD_ARGS naming the budget for a schema nested too deep, or whose patterns or item
    counts repeat more than allowed."""
    try:
        schema = json.loads(source)
    except RecursionError:
        raise _too_deep(budget) from None
    except ValueError as exc:
        raise ProtocolError(ErrorCode.BAD_ARGS, f"json_schema is not JSON: {exc}") from None
    _walk(schema, budget, 1)


def _walk(node: Any, budget: GrammarConfig, depth: int) -> None:
    if depth > budget.max_depth:
        raise _too_deep(budget)
    if isinstance(node, list):
        for item in node:
            _walk(item, budget, depth + 1)
        return
    if not isinstance(node, dict):
        return
    pattern = node.get("pattern")
    if isinstance(pattern, str):
        check_regex(pattern, budget, "json_schema pattern")
    patterns = node.get("patternProperties")
    if isinstance(patterns, dict):
        for key in patterns:
            check_regex(key, budget, "json_schema patternProperties")
    for keyword in _COUNT_KEYWORDS:
        count = node.get(keyword)
        if isinstance(count, int | float) and count > budget.max_repeat:
            raise ProtocolError(
                ErrorCode.BAD_ARGS,
                f"json_schema {keyword} of {count} is over the grammar budget of {budget.max_repeat} "
                "(grammar_max_repeat)",
            )
    for value in node.values():
        _walk(value, budget, depth + 1)


def _too_deep(budget: GrammarConfig) -> ProtocolError:
    return ProtocolError(
        ErrorCode.BAD_ARGS,
        f"json_schema nests deeper than the grammar budget of {budget.max_depth} levels (grammar_max_depth)",
    )


def check_source(kind: str, source: str, budget: GrammarConfig) -> None:
    """Every pre-compile check for a source of ``kind`` (EBNF is left to the time limit)."""
    if kind == "json_schema":
        check_json_schema(source, budget)
    elif kind == "regex":
        check_regex(source, budget)
