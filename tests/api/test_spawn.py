"""Run trees on the control plane (api/services/procs.py), on the real database and Redis: entries
checked against the program's bundle, the plan's bounds on a tree (children per run, depth,
concurrent runs: refused at once, never queued), a child's deadline within its parent's, the
relay a worker talks to (a ProcRequest pushed on Redis gets its ProcReply), cancels that cascade,
and the API and CLI views of a tree. Through the real stack (worker, sandboxes, Celery):
tests/integration/test_spawn_e2e.py."""

from __future__ import annotations

import io
import threading
import time
import uuid
import zipfile

import pytest
import redis
from django.conf import settings

from api.models import Plan, Program, Run
from api.services import procs, programs
from api.services.runs import cancel_run, create_run, start_run
from gpu_worker import contracts
from gpu_worker.protocol import ErrorCode

pytestmark = pytest.mark.django_db

SINGLE = b"""
def main(args):
    return args


async def helper(args):
    return 1
"""


def _zip(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return buf.getvalue()


BUNDLE = _zip(
    {
        "main.py": b"def main(args):\n    return 0\n",
        "agents/__init__.py": b"",
        "agents/scout.py": b"def main(args):\n    return 1\n\ndef other(args):\n    return 2\n",
    }
)


@pytest.fixture
def plan():
    """The free plan, roomy enough for trees unless a test narrows it."""
    # A transactional test before this one flushed the migrations' plans: made again if so.
    plan, _ = Plan.objects.update_or_create(
        name="free", defaults={"max_concurrent_runs": 10, "max_children_per_run": 3, "max_spawn_depth": 2}
    )
    return plan


def _program(tenant, content: bytes, name: str = "p.py") -> Program:
    prog = Program.objects.create(tenant=tenant, name=name)
    programs.add_version(prog, name, content)
    return prog


def _running(tenant, content: bytes = SINGLE, name: str = "p.py") -> Run:
    run, _ = create_run(tenant, _program(tenant, content, name), None, {}, {})
    assert start_run(str(run.pk), "w1") is not None
    return Run.objects.get(pk=run.pk)


# ---------------------------------------------------------------------------------- entries
@pytest.mark.parametrize(
    ("entry", "parsed"),
    [
        (None, ("", "main")),
        ("", ("", "main")),
        ("self", ("", "main")),
        ("self:helper", ("", "helper")),
        (":helper", ("", "helper")),
        ("agents.scout", ("agents.scout", "main")),
        ("agents/scout.py", ("agents.scout", "main")),
        ("agents/scout.py:other", ("agents.scout", "other")),
    ],
)
def test_entries_are_parsed_to_module_and_function(entry, parsed):
    assert procs.parse_entry(entry) == parsed


@pytest.mark.parametrize("entry", ["../etc", "a b", "pkg.1x", "self:not-a-name", "x:class", 7])
def test_malformed_entries_are_einval(entry):
    with pytest.raises(procs.SpawnRefused) as caught:
        procs.parse_entry(entry)
    assert caught.value.code == ErrorCode.BAD_ARGS


def test_entries_are_checked_against_the_bundle(api_tenant_a):
    single = _program(api_tenant_a.tenant, SINGLE).versions.get()
    bundle = _program(api_tenant_a.tenant, BUNDLE, "b.zip").versions.get()
    assert procs.resolve_entry(single, None) == ""
    assert procs.resolve_entry(single, "self:helper") == "self:helper"  # shown as the author wrote it
    assert procs.resolve_entry(bundle, "agents.scout") == "agents.scout:main"
    assert procs.resolve_entry(bundle, "agents/scout.py:other") == "agents.scout:other"
    for version, entry, said in [
        (single, "agents.scout", "a single-file program has no module 'agents.scout'"),
        (single, "self:nowhere", "the program defines no nowhere"),
        (bundle, "agents.spy", "the program's bundle has no agents/spy.py"),
        (bundle, "agents.scout:nowhere", "module agents.scout defines no nowhere"),
    ]:
        with pytest.raises(procs.SpawnRefused, match=said) as caught:
            procs.resolve_entry(version, entry)
        assert caught.value.code == ErrorCode.BAD_ARGS


# ----------------------------------------------------------------------------------- limits
def test_a_child_is_recorded_with_its_parent_and_a_deadline_within_the_parents(api_tenant_a, plan):
    parent = _running(api_tenant_a.tenant)
    child = procs.create_child(str(parent.pk), "self:helper", {"k": [1, 2]}, {"deadline_s": 100}, 12.5)
    assert (child.parent_id, child.depth, child.entry, child.status) == (parent.pk, 1, "self:helper", "queued")
    assert child.program_version_id == parent.program_version_id and child.tenant_id == parent.tenant_id
    assert child.args == {"k": [1, 2]} and child.limits == {"deadline_s": 12.5}
    # A child that states no deadline gets what its parent has left; one shorter keeps its own.
    bare = procs.create_child(str(parent.pk), None, None, None, 9.0)
    assert (bare.args, bare.limits) == ({}, {"deadline_s": 9.0})
    assert procs.create_child(str(parent.pk), None, 1, {"deadline_s": 2}, 9.0).limits == {"deadline_s": 2.0}


def test_a_spawn_loop_stops_at_the_plans_children_per_run(api_tenant_a, plan):
    parent = _running(api_tenant_a.tenant)
    for _ in range(3):
        Run.objects.filter(pk=procs.create_child(str(parent.pk), None, {}, None, 30).pk).update(status="succeeded")
    with pytest.raises(procs.SpawnRefused, match=r"allows 3 children per run \(max_children_per_run\)") as caught:
        procs.create_child(str(parent.pk), None, {}, None, 30)
    assert caught.value.code == ErrorCode.QUOTA  # finished children count too: a loop cannot go on


def test_a_recursive_spawn_stops_at_the_plans_depth(api_tenant_a, plan):
    run = _running(api_tenant_a.tenant)
    for level in (1, 2):
        run = procs.create_child(str(run.pk), None, {}, None, 30)
        assert start_run(str(run.pk), "w1") is not None and run.depth == level
    with pytest.raises(procs.SpawnRefused, match=r"2 level\(s\) deep \(max_spawn_depth\)") as caught:
        procs.create_child(str(run.pk), None, {}, None, 30)
    assert caught.value.code == ErrorCode.QUOTA


def test_a_tree_counts_once_against_concurrency_and_its_live_runs_are_capped(api_tenant_a, plan):
    """A coordinator and its team of three run on a plan of 2 concurrent runs: the tree counts
    once (its root). Below the root, live runs of the whole tree are capped by
    ``max_children_per_run`` and a spawn past it is refused at once, not queued."""
    Plan.objects.filter(name="free").update(max_concurrent_runs=2, max_children_per_run=3)
    parent = _running(api_tenant_a.tenant)
    team = [procs.create_child(str(parent.pk), None, {}, None, 30) for _ in range(3)]
    assert Run.objects.filter(parent=parent).count() == 3
    assert start_run(str(team[0].pk), "w1") is not None
    with pytest.raises(procs.SpawnRefused, match=r"3 live runs below the root.*refused, not queued") as caught:
        procs.create_child(str(team[0].pk), None, {}, None, 30)  # a grandchild counts in the tree too
    assert caught.value.code == ErrorCode.QUOTA
    # The tenant's second tree still starts; a third does not.
    _running(api_tenant_a.tenant, name="second.py")
    from api.services.quotas import ConcurrencyLimitReached, check_can_start

    with pytest.raises(ConcurrencyLimitReached, match="allows 2 concurrent runs"):
        check_can_start(api_tenant_a.tenant, {})


@pytest.mark.parametrize(
    ("args", "limits", "said"),
    [
        ({}, {"deadline_s": "soon"}, "spawn limits refused: deadline_s"),
        ({}, {"gpus": 8}, "spawn limits refused: gpus: not a run limit"),
        ({}, {"max_tokens": 10**8}, "spawn limits refused: max_tokens: can be at most"),
        ({"t": "a\x00b"}, None, "spawn args refused"),
    ],
)
def test_bad_args_or_limits_are_einval(api_tenant_a, plan, args, limits, said):
    parent = _running(api_tenant_a.tenant)
    with pytest.raises(procs.SpawnRefused, match=said) as caught:
        procs.create_child(str(parent.pk), None, args, limits, 30)
    assert caught.value.code == ErrorCode.BAD_ARGS and not Run.objects.filter(parent=parent).exists()


def test_a_run_that_ended_or_has_no_time_left_spawns_nothing(api_tenant_a, plan):
    parent = _running(api_tenant_a.tenant)
    with pytest.raises(procs.SpawnRefused, match="too little for a child"):
        procs.create_child(str(parent.pk), None, {}, None, 0.2)
    cancel_run(parent)
    with pytest.raises(procs.SpawnRefused, match="the spawning run is cancelled"):
        procs.create_child(str(parent.pk), None, {}, None, 30)


# ---------------------------------------------------------------------------------- cancels
def test_cancelling_a_run_cancels_its_live_descendants(api_tenant_a, plan):
    parent = _running(api_tenant_a.tenant)
    child = procs.create_child(str(parent.pk), None, {}, None, 30)
    start_run(str(child.pk), "w1")
    grandchild = procs.create_child(str(child.pk), None, {}, None, 30)
    done = procs.create_child(str(parent.pk), None, {}, None, 30)
    Run.objects.filter(pk=done.pk).update(status="succeeded")
    cancel_run(parent)
    statuses = dict(Run.objects.values_list("pk", "status"))
    assert statuses[child.pk] == statuses[grandchild.pk] == "cancelled"
    assert statuses[done.pk] == "succeeded"
    flags = redis.Redis.from_url(settings.REDIS_URL)
    assert flags.exists(f"symphony:cancel:{child.pk}")  # its executor stops its program


def test_cancel_child_takes_only_the_parents_own_children(api_tenant_a, plan):
    parent, other = _running(api_tenant_a.tenant), _running(api_tenant_a.tenant, name="q.py")
    child = procs.create_child(str(parent.pk), None, {}, None, 30)
    with pytest.raises(procs.SpawnRefused, match="not a child of this run"):
        procs.cancel_child(str(other.pk), str(child.pk))
    assert procs.cancel_child(str(parent.pk), str(child.pk)) is True
    assert procs.cancel_child(str(parent.pk), str(child.pk)) is False  # already ended


# ------------------------------------------------------------------------------------ relay
@pytest.mark.django_db(transaction=True)  # the broker's thread has its own connection
def test_the_broker_answers_relayed_requests_and_runs_children_with_its_executor(api_tenant_a, plan):
    """What the worker does (gpu_worker/ops/procs.py): push a ProcRequest on the parent's list,
    BLPOP the reply; the broker creates the child and hands it to ``execute``."""
    parent = _running(api_tenant_a.tenant)
    executed: list[str] = []
    ran = threading.Event()

    def execute(child_id: str) -> None:
        executed.append(child_id)
        ran.set()

    client = redis.Redis.from_url(settings.REDIS_URL)

    def ask(**fields) -> contracts.ProcReply:
        request = contracts.ProcRequest(id=uuid.uuid4().hex, parent=str(parent.pk), **fields)
        client.rpush(contracts.proc_requests_key(parent.pk), request.encode())
        got = client.blpop([contracts.proc_reply_key(request.id)], timeout=10)
        assert got is not None, "no reply from the broker"
        return contracts.ProcReply.decode(got[1])

    with procs.ProcessBroker(str(parent.pk), 60, execute):
        spawned = ask(op="spawn", entry="self:helper", args={"x": 1})
        assert spawned.ok and ran.wait(5) and executed == [spawned.child]
        unknown = ask(op="spawn", entry="nope.mod")
        assert (unknown.ok, unknown.code) == (False, ErrorCode.BAD_ARGS) and "single-file" in unknown.message
        cancelled = ask(op="cancel", child=spawned.child)
        assert cancelled.ok and cancelled.cancelled
        stranger = ask(op="cancel", child=str(uuid.uuid4()))
        assert (stranger.ok, stranger.code) == (False, ErrorCode.PERMISSION)
    assert Run.objects.get(pk=spawned.child).status == "cancelled"


def test_the_broker_ends_with_its_run_not_at_its_next_poll(api_tenant_a, plan):
    """Found by the account soak: the broker's blocking pop (1 s timeout) held the end of every
    sandboxed run until the next whole second after its start. Its exit wakes the pop now, and
    leaves no wake-up entry behind."""
    parent = _running(api_tenant_a.tenant)
    ends = []
    for _ in range(3):
        with procs.ProcessBroker(str(parent.pk), 60, lambda child_id: None):
            time.sleep(0.1)  # the pop is blocking
            exit_at = time.perf_counter()
        ends.append(time.perf_counter() - exit_at)
    assert max(ends) < 0.3, ends
    assert not redis.Redis.from_url(settings.REDIS_URL).exists(f"{contracts.proc_requests_key(parent.pk)}:wake")


@pytest.mark.django_db(transaction=True)
def test_the_broker_cancels_live_children_when_its_run_ends(api_tenant_a, plan):
    parent = _running(api_tenant_a.tenant)
    broker = procs.ProcessBroker(str(parent.pk), 60, lambda child_id: start_run(child_id, "w1"))
    with broker:
        request = contracts.ProcRequest(id="r1", op="spawn", parent=str(parent.pk))
        reply = broker.handle(request)
    assert reply.ok and Run.objects.get(pk=reply.child).status == "cancelled"


@pytest.mark.django_db(transaction=True)
def test_a_child_spawned_while_its_parent_ends_is_cancelled_not_run(api_tenant_a, plan):
    parent = _running(api_tenant_a.tenant)
    executed: list[str] = []
    broker = procs.ProcessBroker(str(parent.pk), 60, executed.append)
    with broker:
        pass  # the run ended; a spawn its relay still delivers must not start a child nobody ends
    reply = broker.handle(contracts.ProcRequest(id="late", op="spawn", parent=str(parent.pk)))
    assert reply.ok and executed == [] and Run.objects.get(pk=reply.child).status == "cancelled"


# --------------------------------------------------------------------------------- API, CLI
def test_a_run_lists_its_children_and_runs_filter_by_parent(api_tenant_a, api_tenant_b, plan):
    parent = _running(api_tenant_a.tenant)
    kids = [procs.create_child(str(parent.pk), e, {}, None, 30) for e in (None, "self:helper")]
    client = api_tenant_a.key_client()
    body = client.get(f"/api/v1/runs/{parent.pk}").json()
    assert [c["id"] for c in body["children"]] == [str(k.pk) for k in kids]
    assert [c["entry"] for c in body["children"]] == ["", "self:helper"] and body["parent"] is None
    child = client.get(f"/api/v1/runs/{kids[1].pk}").json()
    expected = (str(parent.pk), 1, "self:helper", [])
    assert (child["parent"], child["depth"], child["entry"], child["children"]) == expected
    listed = client.get(f"/api/v1/runs?parent={parent.pk}").json()["results"]
    assert sorted(r["id"] for r in listed) == sorted(str(k.pk) for k in kids)
    assert "children" not in listed[0]
    assert client.get("/api/v1/runs?parent=nope").status_code == 400
    # Another tenant sees none of it.
    other = api_tenant_b.key_client()
    assert other.get(f"/api/v1/runs?parent={parent.pk}").json()["results"] == []
    assert other.get(f"/api/v1/runs/{parent.pk}").status_code == 404


def test_runs_show_lists_the_children():
    from symphony_client import output

    run = {"id": "p1", "status": "running", "children": [{"id": "c1", "status": "succeeded", "entry": ""}]}
    text = output.run_record(run)
    assert "children (1):" in text and "c1  succeeded  main" in text
