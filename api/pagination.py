"""List pagination: DRF's limit/offset with the page size bounded.

DRF's ``LimitOffsetPagination`` takes any ``?limit=`` unless ``max_limit`` is set, and a limit
past PostgreSQL's bigint made the SQL ``LIMIT`` fail with a 500 (found by the schema fuzzer).
A bound also keeps one request from listing a tenant's whole history in one response.
"""

from __future__ import annotations

from rest_framework.pagination import LimitOffsetPagination


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    """``?limit=`` (default ``PAGE_SIZE``) is capped at ``max_limit``; ``?offset=`` past the
    last row gives an empty page without a query (DRF's own check against ``count``)."""

    max_limit = 500
