"""``manage.py check --deploy`` compares what the deploy's processes may hold of PostgreSQL's
connections with what the server allows: every web process has its own pool of
``DATABASE_POOL_MAX_SIZE``, so web processes x pool + the other connections above the server's
``max_connections`` (less its reserved ones, read from the server) is an error; a deploy that
fits, or one without a pool, is none."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from api.checks import CONNECTIONS_EXCEED_SERVER, db_connections_fit_the_server, server_connection_limit

pytestmark = pytest.mark.django_db


def test_web_processes_pools_beyond_max_connections_are_an_error(settings, monkeypatch) -> None:
    limit = server_connection_limit()
    assert limit is not None and limit > 10, limit
    monkeypatch.setenv("DATABASE_POOL_MAX_SIZE", "16")
    settings.SYMPHONY_OTHER_DB_CONNECTIONS = 4
    settings.SYMPHONY_WEB_PROCESSES = (limit - 4) // 16  # as many as fit
    assert db_connections_fit_the_server() == []

    settings.SYMPHONY_WEB_PROCESSES += 1  # one web process more than the server has room for
    errors = db_connections_fit_the_server()
    assert [e.id for e in errors] == [CONNECTIONS_EXCEED_SERVER], errors
    needed = settings.SYMPHONY_WEB_PROCESSES * 16 + 4
    assert f"= {needed}, more than the {limit} PostgreSQL allows" in errors[0].msg, errors[0].msg
    call_command("check")  # not a deploy check: migrate is never stopped by it
    with pytest.raises(SystemCheckError) as raised:
        call_command("check", deploy=True)
    assert CONNECTIONS_EXCEED_SERVER in str(raised.value)


def test_without_a_pool_there_is_nothing_to_compare(settings, monkeypatch) -> None:
    monkeypatch.setenv("DATABASE_POOL_MAX_SIZE", "0")
    settings.SYMPHONY_WEB_PROCESSES = 10_000
    assert db_connections_fit_the_server() == []


def test_the_default_deploy_fits_the_test_server(settings, monkeypatch) -> None:
    """One web process of 16 and the default allowance for the rest, as ``make up`` runs it."""
    monkeypatch.delenv("DATABASE_POOL_MAX_SIZE", raising=False)
    assert db_connections_fit_the_server() == []
