"""Querysets compiled once a process (api/compiled_queries.py) give the instances the querysets
give: the same fields and values (JSON, dates and UUIDs through the columns' converters), the
``select_related`` object loaded, a deferred field still deferred, values bound per call, and
no row when the queryset has none. On the real database."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from api.compiled_queries import CompiledQuery
from api.models import ApiKey, ProgramVersion
from api.services import openai_requests, programs
from api.services.keys import KEY_BY_PREFIX

pytestmark = pytest.mark.django_db


def _fields(obj) -> dict:
    deferred = obj.get_deferred_fields()
    return {f.attname: getattr(obj, f.attname) for f in obj._meta.concrete_fields if f.attname not in deferred}


def test_the_key_by_prefix_is_the_querysets_key_with_its_tenant(api_tenant_a, api_tenant_b):
    for tenant in (api_tenant_a, api_tenant_b):
        prefix = tenant.key_secret.split("_")[1]
        expected = ApiKey.objects.select_related("tenant").get(prefix=prefix)
        got = KEY_BY_PREFIX.first(prefix)
        assert got is not None and _fields(got) == _fields(expected)
        assert isinstance(got.scopes, list) and got.scopes == expected.scopes  # JSON, converted
        with CaptureQueriesContext(connection) as queries:
            assert _fields(got.tenant) == _fields(expected.tenant)  # loaded with it: no query
        assert len(queries) == 0
        assert got._state.adding is False and got._state.db == "default"
    assert KEY_BY_PREFIX.first("no-such-prefix") is None
    with pytest.raises(ApiKey.DoesNotExist):
        KEY_BY_PREFIX.get("no-such-prefix")


def test_the_latest_builtin_version_is_the_querysets_with_its_bytes_deferred(api_tenant_a):
    tenant = api_tenant_a.tenant
    assert openai_requests.LATEST_BUILTIN.first(tenant.pk) is None
    first = openai_requests.builtin_version(tenant)
    programs.add_version(first.program, "openai_lip.py", b"def main(args):\n    return 2\n")
    expected = (
        ProgramVersion.objects.select_related("program")
        .defer("content")
        .filter(program__tenant=tenant, program__name=openai_requests.BUILTIN_PROGRAM)
        .order_by("-number")
        .first()
    )
    got = openai_requests.LATEST_BUILTIN.first(tenant.pk)
    assert got is not None and expected is not None
    assert got.number == 2 and _fields(got) == _fields(expected)
    assert got.get_deferred_fields() == {"content"}
    assert bytes(got.content) == b"def main(args):\n    return 2\n"  # loaded when asked for
    assert _fields(got.program) == _fields(expected.program)


def test_a_marker_that_does_not_land_once_among_the_parameters_is_refused():
    twice = CompiledQuery(lambda v: ApiKey.objects.filter(prefix=v, name=v)[:1], markers=("m",))
    with pytest.raises(ValueError, match="2 times"):
        twice.first("x")
    with pytest.raises(TypeError):
        KEY_BY_PREFIX.first()
