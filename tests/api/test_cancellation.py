"""Cancelling a running run reaches its executor through a Redis flag (real Redis): the watch
ends the worker session once, whoever asks first, and the executor gets that same ending (its
usage is reported by the worker only once). End to end through Celery, the sandbox and the
worker: tests/integration/test_run_e2e.py::test_cancelling_a_running_run_stops_its_program."""

from __future__ import annotations

import time
import uuid

import pytest

from api.services.cancellation import CancelWatch, request_stop, stop_requested
from api.services.runs import cancel_run, create_run, start_run


def _counting(result: object = "usage", error: Exception | None = None):
    calls: list[float] = []

    def end() -> object:
        calls.append(time.monotonic())
        if error is not None:
            raise error
        return result

    return end, calls


def test_the_flag_ends_the_session_once_and_the_executor_gets_that_ending():
    run_id = str(uuid.uuid4())
    end, calls = _counting()
    with CancelWatch(run_id, end) as watch:
        time.sleep(0.8)
        assert calls == [] and not watch.cancelled.is_set()  # no flag: the program runs on
        assert request_stop(run_id)
        assert watch.cancelled.wait(5)
    assert watch.end_session() == "usage" and watch.end_session() == "usage"
    assert len(calls) == 1


def test_a_watch_never_closes_the_shared_redis_client_other_runs_are_using(settings):
    """Several runs execute in one process (a Celery thread pool, the web process's in-process
    built-in runs): a watch that closed the process's shared client at its end disconnected
    every pooled connection, and another run's ``publish_end`` then failed with EBADF."""
    from api import redis_client
    from api.services.cancellation import POLL_S

    client = redis_client.shared(settings.REDIS_URL)
    in_use = client.connection_pool.get_connection()
    try:
        in_use.send_command("BLPOP", f"test:nothing:{uuid.uuid4()}", 3)  # another run's command, in flight
        with CancelWatch(str(uuid.uuid4()), lambda: None):
            time.sleep(POLL_S * 2)
        assert in_use.read_response() is None  # its reply (BLPOP's timeout), not a closed socket
    finally:
        client.connection_pool.release(in_use)


def test_without_a_cancel_the_executor_ends_the_session_itself():
    end, calls = _counting()
    with CancelWatch(str(uuid.uuid4()), end) as watch:
        pass
    assert watch.end_session() == "usage" and len(calls) == 1 and not watch.cancelled.is_set()


def test_a_failed_ending_is_reported_to_the_executor_and_not_retried():
    run_id = str(uuid.uuid4())
    end, calls = _counting(error=ConnectionError("worker gone"))
    with CancelWatch(run_id, end) as watch:
        request_stop(run_id)
        assert watch.cancelled.wait(5)
    for _ in range(2):
        with pytest.raises(ConnectionError, match="worker gone"):
            watch.end_session()
    assert len(calls) == 1


def test_a_watch_that_ends_leaves_other_threads_redis_connections_alone():
    """The watch polls with the process's shared client; closing it when the watch ended
    disconnected every connection of the pool, a command of another thread included (a run
    tree's executors share one process: a cancel's flag could fail to be set)."""
    from api.services import cancellation

    pool = cancellation._redis().connection_pool
    conn = pool.get_connection("PING")
    try:
        with CancelWatch(str(uuid.uuid4()), lambda: None):
            time.sleep(cancellation.POLL_S * 2)
        assert conn._sock is not None  # still connected: a command in flight on it would survive
    finally:
        pool.release(conn)


@pytest.mark.django_db
def test_cancelling_a_run_raises_the_flag_its_executor_watches(api_tenant_a):
    from api.models import Program
    from api.services import programs

    prog = Program.objects.create(tenant=api_tenant_a.tenant, name="p")
    programs.add_version(prog, "p.py", b"def main(a):\n    return 1\n")
    run, _ = create_run(api_tenant_a.tenant, prog, None, {}, {})
    start_run(str(run.pk), "local")
    assert not stop_requested(str(run.pk))
    cancel_run(run)
    assert stop_requested(str(run.pk))
