"""JSON as PostgreSQL can store it, for every JSON request body (REST and OpenAI endpoints).

Python's json module reads more than JSON: ``NaN`` and ``Infinity``, numbers that overflow to
an infinity (``1e400``), and ``\\ud800`` escapes that make a lone surrogate. PostgreSQL's
``jsonb`` and ``text`` refuse all of them: a body carrying one would pass validation and fail at
the insert with a 500. They are refused here, while parsing, with a 400 that says why.
(U+0000, which JSON allows but PostgreSQL does not, is refused by the serializers'
validators: api/validators.py.) Nesting is bounded too (``MAX_JSON_DEPTH``): deeper documents
are refused here, before anything walks them recursively.
"""

from __future__ import annotations

import codecs
import json
import math

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from api.uploads import body_too_large
from api.validators import MAX_JSON_DEPTH, contains_surrogate, json_depth

TOO_DEEP = f"arrays and objects nest deeper than {MAX_JSON_DEPTH} levels"


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def loads(data: str | bytes) -> object:
    """Parse a JSON document; ``ValueError`` says what is not storable JSON."""
    try:
        value = json.loads(data, parse_constant=_no_constant, parse_float=_finite)
    except RecursionError:
        raise ValueError(TOO_DEEP) from None
    if json_depth(value) > MAX_JSON_DEPTH:
        raise ValueError(TOO_DEEP)
    if contains_surrogate(value):
        raise ValueError("a string holds an unpaired UTF-16 surrogate escape (\\ud800-\\udfff)")
    return value


class StorableJSONParser(JSONParser):
    """DRF's JSON parser with :func:`loads` (400 ``parse_error`` naming the problem)."""

    def parse(self, stream, media_type=None, parser_context=None):
        encoding = (parser_context or {}).get("encoding", "utf-8")
        limit = settings.SYMPHONY_MAX_REQUEST_BYTES
        data = stream.read(limit + 1)  # never more than the limit in memory, whatever the server
        if len(data) > limit:
            raise body_too_large(limit)
        try:
            return loads(codecs.decode(data, encoding))
        except ValueError as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
