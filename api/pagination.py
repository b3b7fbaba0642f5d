"""List pagination: DRF's limit/offset with the page size bounded and malformed values refused.

DRF's ``LimitOffsetPagination`` takes any ``?limit=`` unless ``max_limit`` is set, and a limit
past PostgreSQL's bigint made the SQL ``LIMIT`` fail with a 500 (found by the schema fuzzer).
A bound also keeps one request from listing a tenant's whole history in one response. DRF also
answers ``?limit=-1`` or ``?offset=abc`` with its defaults, as if the parameter had not been
sent; here they are a 400 ``invalid`` naming the parameter.
"""

from __future__ import annotations

from rest_framework.exceptions import ValidationError
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.request import Request


def _integer(request: Request, name: str, minimum: int) -> int | None:
    """The query parameter ``name`` as an integer >= ``minimum``; ``None`` when absent or empty."""
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise ValidationError({name: [f"must be an integer >= {minimum}, not {raw[:40]!r}"]})
    return value


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    """``?limit=`` (default ``PAGE_SIZE``, at least 1) is capped at ``max_limit``; ``?offset=``
    (at least 0) past the last row gives an empty page without a query (DRF's own check against
    ``count``)."""

    max_limit = 500

    def get_limit(self, request: Request) -> int | None:
        limit = _integer(request, self.limit_query_param, 1)
        return self.default_limit if limit is None else min(limit, self.max_limit)

    def get_offset(self, request: Request) -> int:
        return _integer(request, self.offset_query_param, 0) or 0
