"""Querysets on the path of every ``/v1`` answer, compiled to SQL once a process.

Why: profiled on a 2-core host, a statement of the request path cost ~2 ms of Python through the
ORM (compiling the queryset, building the instances) for a query PostgreSQL answers in a tenth of
a millisecond; the same SQL through a cursor took a quarter of the time (bench/NOTES.md, "what an
ORM statement costs"). A request makes a dozen of them.

A :class:`CompiledQuery` is made from a function that builds the queryset from its values and
one marker value per argument. Its first call compiles the queryset built from the markers,
finds where each marker landed among the SQL's parameters, and keeps the SQL with the
compiler's description of the columns. Every call binds its own values there, runs the SQL
through the thread's connection (the ORM's own cursor wrapper: in the caller's transaction,
seen by the query counters) and builds the instances as Django's ``ModelIterable`` does
(the columns' converters, ``from_db``, the ``select_related`` objects). So a shape qualifies
only when its SQL does not depend on the values: no ``__in`` lists, no ``None`` lookups, no
values that change the joins. The tests compare each compiled query's instances with the
queryset's own (``tests/api/test_compiled_queries.py``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import Model, QuerySet
from django.db.models.query import get_related_populators

M = TypeVar("M", bound=Model)


@dataclass(frozen=True)
class _Compiled:
    sql: str
    params: tuple[Any, ...]
    #: Where each argument goes in ``params``.
    slots: tuple[int, ...]
    model: type[Model]
    fields: slice
    init_list: tuple[str, ...]
    converters: tuple[tuple[int, tuple[Callable[..., Any], ...], Any], ...]
    related_populators: tuple[Any, ...]


class CompiledQuery(Generic[M]):
    """``build(*values)``'s queryset, compiled once; :meth:`first` and :meth:`get` run it with new
    values."""

    def __init__(self, build: Callable[..., QuerySet[M]], markers: Sequence[Any]) -> None:
        self._build = build
        self._markers = tuple(markers)
        self._compiled: _Compiled | None = None
        self._lock = threading.Lock()

    def _compile(self) -> _Compiled:
        with self._lock:
            if self._compiled is None:
                self._compiled = self._compile_now()
            return self._compiled

    def _compile_now(self) -> _Compiled:
        queryset = self._build(*self._markers)
        compiler = queryset.query.get_compiler(using=DEFAULT_DB_ALIAS)
        sql, params = compiler.as_sql()
        slots = []
        for marker in self._markers:
            found = [i for i, p in enumerate(params) if type(p) is type(marker) and p == marker]
            if len(found) != 1:
                raise ValueError(f"marker {marker!r} is {len(found)} times in the parameters of {sql}")
            slots.append(found[0])
        select, klass_info = compiler.select, compiler.klass_info
        assert klass_info is not None and not compiler.annotation_col_map, "plain model rows only"
        fields = klass_info["select_fields"]
        converters = compiler.get_converters([s[0] for s in select])
        return _Compiled(
            sql=sql,
            params=tuple(params),
            slots=tuple(slots),
            model=klass_info["model"],
            fields=slice(fields[0], fields[-1] + 1),
            init_list=tuple(s[0].target.attname for s in select[fields[0] : fields[-1] + 1]),
            converters=tuple((pos, tuple(convs), expr) for pos, (convs, expr) in converters.items()),
            related_populators=tuple(get_related_populators(klass_info, select, DEFAULT_DB_ALIAS)),
        )

    def first(self, *values: Any) -> M | None:
        """The first row of ``build(*values)``'s queryset as its model instance, or ``None``."""
        if len(values) != len(self._markers):
            raise TypeError(f"{len(self._markers)} values expected, got {len(values)}")
        compiled = self._compile()
        params = list(compiled.params)
        for slot, value in zip(compiled.slots, values, strict=True):
            params[slot] = value
        connection = connections[DEFAULT_DB_ALIAS]
        with connection.cursor() as cursor:
            cursor.execute(compiled.sql, params)
            fetched = cursor.fetchone()
        if fetched is None:
            return None
        row = list(fetched)
        for pos, convs, expression in compiled.converters:
            value = row[pos]
            for converter in convs:
                value = converter(value, expression, connection)
            row[pos] = value
        obj = compiled.model.from_db(DEFAULT_DB_ALIAS, list(compiled.init_list), row[compiled.fields])
        for populator in compiled.related_populators:
            populator.populate(row, obj)
        return obj  # type: ignore[return-value]

    def get(self, *values: Any) -> M:
        """:meth:`first`, or the model's ``DoesNotExist`` as ``QuerySet.get`` raises it."""
        obj = self.first(*values)
        if obj is None:
            model: Any = self._compile().model
            raise model.DoesNotExist(f"no {model.__name__} for {values!r}")
        return obj
