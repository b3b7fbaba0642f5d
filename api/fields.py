"""Model fields of our own."""

from __future__ import annotations

from typing import Any

from django.db import models
from psycopg.types.json import Json, Jsonb


class JSONAsSentField(models.JSONField):
    """JSON kept as written: PostgreSQL's ``json`` type instead of ``jsonb``.

    ``jsonb`` stores objects with their keys sorted (shorter keys first), so a program's result
    ``{"text": ..., "score": ...}`` came back as ``{"score": ..., "text": ...}``. ``json`` keeps
    the text, key order included. The price: no equality or containment lookups on the column,
    which nothing asks of a run's result.
    """

    def db_type(self, connection: Any) -> str:
        return "json" if connection.vendor == "postgresql" else super().db_type(connection)

    def get_db_prep_value(self, value: Any, connection: Any, prepared: bool = False) -> Any:
        adapted = super().get_db_prep_value(value, connection, prepared)
        if connection.vendor != "postgresql" or not isinstance(adapted, Jsonb):
            return adapted
        # Django sends a ``jsonb`` parameter, which would sort the keys on its way in.
        return Json(adapted.obj, dumps=adapted.dumps)

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        if value is not None and not isinstance(value, str):
            return value  # psycopg already decoded a ``json`` column (objects keep their order)
        return super().from_db_value(value, expression, connection)
