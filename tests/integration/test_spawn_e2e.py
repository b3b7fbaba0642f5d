"""``symphony.spawn`` through the whole real stack: REST -> Celery -> gVisor sandbox -> worker on
the tiny model; the LIP's spawns relayed by the worker to its executor (api/services/procs.py),
children executed in their own sandboxes on the same worker, results and errors back through
``Child.wait``, cancels that cascade, plan bounds that stop a spawn bomb while another tenant's
run goes on, bad input refused with clear errors, and a tree's usage on the invoice."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import uuid
import zipfile
from collections.abc import Iterator
from datetime import date
from pathlib import Path

import pytest

from tests.conftest import ROOT, container_names, wait_for
from tests.plugins.worker import RunningWorker, start_worker

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.integration,
    pytest.mark.docker,
    pytest.mark.vllm,
]

MAIN = b"""
import symphony as sy

CONTEXT = "A shared context that every agent of the team reads without computing it again."


def main(args):
    mode = args["mode"]
    if mode == "tree":
        kv = sy.kv_create(args["file"])
        sy.pred(kv, sy.tokenize(CONTEXT))
        kv.close()
        kids = [sy.spawn("agents/reader.py", {"file": args["file"], "n": 3}) for _ in range(2)]
        bad = sy.spawn("self:boom", {"why": "on purpose"})
        results = [k.wait(timeout=100) for k in kids]
        try:
            bad.wait(timeout=100)
            failed = None
        except sy.ChildFailed as exc:
            failed = {"status": exc.status, "error": exc.error, "is_symphony_error": isinstance(exc, sy.SymphonyError)}
        return {"children": [k.id for k in kids], "bad": bad.id, "results": results, "failed": failed}
    if mode == "cancel":
        a, b = sy.spawn("self:sleeper", {"s": 90}), sy.spawn("self:sleeper", {"s": 90})
        sy.send_to_user({"children": [a.id, b.id]})
        first = a.cancel()
        try:
            a.wait(timeout=60)
            waited = "returned"
        except sy.ChildFailed as exc:
            waited = exc.status
        sy.send_to_user({"waited": waited, "first": first, "again": a.cancel()})
        sy.sleep(90)
        return "not cancelled"
    if mode == "loop":
        spawned = []
        try:
            while True:
                spawned.append(sy.spawn("self:sleeper", {"s": 90}).id)
        except sy.QuotaExceeded as exc:
            return {"spawned": spawned, "error": str(exc)}
    if mode == "recurse":
        try:
            child = sy.spawn(None, {"mode": "recurse"})
        except sy.QuotaExceeded as exc:
            return {"refused": str(exc)}
        return {"below": child.wait(timeout=100)}
    if mode == "talk":
        # Children of one tree hand work and answers to each other through channels.
        kids = [sy.spawn("self:agent", {"n": 2}) for _ in range(2)]
        tasks = sy.channel("tasks")
        for i in range(4):
            tasks.send({"task": i})
        answers = sorted((sy.channel("answers").recv(timeout=100) for _ in range(4)), key=lambda a: a["task"])
        done = [k.wait(timeout=100) for k in kids]
        return {"answers": answers, "done": done, "children": [k.id for k in kids]}
    if mode == "shares":
        # Three identical children hold one shared context at once; then one holds it alone.
        kv = sy.kv_create("run/shared")
        sy.release(sy.pred(kv, sy.tokenize(CONTEXT * 8)))
        kv.close()
        ready, go = sy.channel("ready"), sy.channel("go")
        kids = [sy.spawn("self:holder", {}) for _ in range(3)]
        for _ in kids:
            ready.recv()
        for _ in kids:
            go.send(1)
        held = [k.wait() for k in kids]
        solo = sy.spawn("self:holder", {})
        ready.recv()
        go.send(1)
        held.append(solo.wait())
        return {"children": [k.id for k in kids], "solo": solo.id, "held": held}
    if mode == "scoped":
        # A context shared by the tree in a run-scoped file; the run is cancelled while it sleeps.
        kv = sy.kv_create("run/ctx")
        sy.pred(kv, sy.tokenize(CONTEXT))
        kv.close()
        seen = sy.spawn("self:scoped_reader", {}).wait()
        try:
            sy.kv_open(f"runtree-{sy.session().info.run_id}--ctx")
            reserved = "opened"
        except sy.InvalidArgument as exc:
            reserved = str(exc)
        sy.send_to_user({"seen": seen, "reserved": reserved})
        sy.sleep(120)
        return "not cancelled"
    if mode == "orphaned":
        # Three children fail at once; the parent waits for their messages with no timeout.
        import time

        sub = sy.channel("progress").subscribe()
        kids = [sy.spawn("self:report_then_boom", {})] + [sy.spawn("self:boom", {"why": f"child {i}"}) for i in (1, 2)]
        start = time.monotonic()
        first = sy.channel("results").recv()
        try:
            sy.channel("results").recv()
            second = "a message"
        except sy.SendersGone as exc:
            second = {"error": str(exc), "reason": exc.reason, "closed": isinstance(exc, sy.ChannelClosed)}
        waited = time.monotonic() - start
        try:
            sub.recv()
            on_sub = "a message"
        except sy.ChannelClosed as exc:
            on_sub = type(exc).__name__
        statuses = []
        for kid in kids:
            try:
                kid.wait()
                statuses.append("succeeded")
            except sy.ChildFailed as exc:
                statuses.append(exc.status)
        return {"first": first, "second": second, "waited": waited, "sub": on_sub, "statuses": statuses,
                "children": [k.id for k in kids]}
    if mode == "async":
        import asyncio

        return asyncio.run(together(args))
    if mode == "bad":
        conn = sy.session().conn
        out = {}
        for name, call in [
            ("unknown_module", lambda: sy.spawn("agents.nope", {})),
            ("unknown_function", lambda: sy.spawn("self:nowhere", {})),
            ("nan_args", lambda: sy.spawn(None, {"x": float("nan")})),
            ("set_args", lambda: sy.spawn(None, {1, 2})),
            ("nan_on_the_wire", lambda: conn.call("spawn", {"entry": "", "args": {"x": float("nan")}})),
            ("bad_limits", lambda: sy.spawn(None, {}, limits={"gpus": 1})),
            ("not_my_child", lambda: conn.call("child_wait", {"child": args["stranger"]})),
        ]:
            try:
                call()
                out[name] = "no error"
            except sy.SymphonyError as exc:
                out[name] = f"{type(exc).__name__}: {exc}"
        return out
    return "hello"


async def together(args):
    # The asyncio flavour: children spawned and awaited concurrently.
    import asyncio

    from symphony import aio

    s = await aio.connect()
    kids = await asyncio.gather(*(s.spawn(None, {"mode": "hello"}) for _ in range(2)))
    slow = await s.spawn("self:sleeper", {"s": 60})
    results = await asyncio.gather(*(k.wait(timeout=100) for k in kids))
    cancelled = await slow.cancel()
    try:
        await slow.wait(timeout=30)
        waited = "returned"
    except sy.ChildFailed as exc:
        waited = exc.status
    return {"results": results, "cancelled": cancelled, "waited": waited, "ids": [k.id for k in kids] + [slow.id]}


def boom(args):
    raise RuntimeError(args["why"])


def holder(args):
    import time

    sy.channel("ready").send(1)
    sy.channel("go").recv()
    kv = sy.kv_open("run/shared", "r")
    time.sleep(4)  # holding the context, making no call (no wait that could swap it out)
    n = len(kv)
    kv.close()
    time.sleep(1.2)  # the worker's tick sees it released before the session ends
    return n


def scoped_reader(args):
    kv = sy.kv_open("run/ctx", "r")
    return len(kv)


def report_then_boom(args):
    sy.channel("results").send({"partial": "kept"})
    raise RuntimeError("after reporting")


def sleeper(args):
    sy.sleep(args["s"])
    return "slept"


def agent(args):
    served = []
    for _ in range(args["n"]):
        msg = sy.channel("tasks").recv_message(timeout=100)
        prompt = sy.tokenize(f"Task {msg.data['task']}:")
        word = sy.detokenize(sy.generate(sy.kv_create(), prompt, max_tokens=2, stop=[]))
        sy.channel("answers").send({"task": msg.data["task"], "by": sy.session().info.run_id, "text": word})
        served.append(msg.data["task"])
    return served
"""

READER = b"""
import symphony as sy


def main(args):
    kv = sy.kv_open(args["file"], "r")
    mine = kv.fork()
    out = sy.generate(mine, sy.tokenize(" Agent:"), max_tokens=args["n"], stop=[])
    return {"context_tokens": len(kv), "generated": len(out)}
"""


def _bundle(tmp_path: Path) -> Path:
    path = tmp_path / "team.zip"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("main.py", MAIN)
        z.writestr("agents/__init__.py", b"")
        z.writestr("agents/reader.py", READER)
    path.write_bytes(buf.getvalue())
    return path


@pytest.fixture(scope="module")
def stack_worker(tiny_model_dir: Path) -> Iterator[RunningWorker]:
    with start_worker(tiny_model_dir, name="spawn") as worker:
        yield worker


@pytest.fixture
def stack_concurrency() -> int:
    """Two runs at once: a tenant's spawn bomb and another tenant's run side by side."""
    return 2


@pytest.fixture
def tree_plan(api_tenant_a):
    from api.models import Plan, Tenant

    Plan.objects.update_or_create(
        name="trees",
        defaults={"max_concurrent_runs": 5, "max_children_per_run": 3, "max_spawn_depth": 2, "max_run_seconds": 150},
    )
    Tenant.objects.filter(pk=api_tenant_a.tenant.pk).update(plan="trees")


@pytest.fixture
def team(stack, api_tenant_a, tree_plan, tmp_path):
    from symphony_client import Client

    client = Client(stack, api_tenant_a.key_secret, timeout=60)
    program = client.upload_program(_bundle(tmp_path), name="team")
    return client, program["id"]


def _nothing_left(worker: RunningWorker, docker_client, run_ids: list[str]) -> None:
    """No session, sandbox container or relay list outlives the runs of a tree."""
    import redis
    from django.conf import settings

    from api.models import Run
    from sandbox.spec import LABEL_RUN

    try:
        wait_for(lambda: worker.admin.health()["sessions"] == 0, timeout=60, message="sessions ended")
    except BaseException:
        left = [(s["run_id"], s["connected"]) for s in worker.admin.stats()["sessions"]]
        statuses = {r: Run.objects.filter(pk=r).values_list("status", "parent_id").first() for r, _ in left}
        pytest.fail(f"sessions left: {left} runs: {statuses} ours: {run_ids}\n{worker.log_tail(6000)}")
    for run_id in run_ids:
        wait_for(
            lambda rid=run_id: not container_names(docker_client, label=f"{LABEL_RUN}={rid}"),
            timeout=60,
            message=f"container of {run_id} removed",
        )
    assert list(redis.Redis.from_url(settings.REDIS_URL).scan_iter(match="symphony:procs:*")) == []


def _cli(url: str, key: str, tmp_path: Path, *argv: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYMPHONY_")}
    env.update(PYTHONPATH=str(ROOT / "client"), SYMPHONY_CONFIG=str(tmp_path / "cli.json"))
    done = subprocess.run(
        [sys.executable, "-m", "symphony_client", *argv, "--url", url, "--api-key", key],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _finished(client, run_id: str, timeout: float = 180) -> dict:
    wait_for(lambda: client.get_run(run_id)["status"] not in ("queued", "running"), timeout=timeout)
    return client.get_run(run_id)


def test_children_share_a_kv_file_and_a_failure_reaches_wait_and_usage_adds_up(stack, team, api_tenant_a, tmp_path):
    from api.models import Run, UsageRecord
    from api.services.billing import invoice

    client, program = team
    stack_url = str(stack)
    run = client.create_run(program, args={"mode": "tree", "file": "team-ctx"}, limits={"deadline_s": 140})
    final = _finished(client, run["id"])
    assert final["status"] == "succeeded", final["error"]
    result = final["result"]
    # Both agents read the one stored context (their own tokens only were computed) and generated.
    context_tokens = {r["context_tokens"] for r in result["results"]}
    assert len(context_tokens) == 1 and context_tokens.pop() > 5
    assert [r["generated"] for r in result["results"]] == [3, 3]
    assert result["failed"]["status"] == "failed" and result["failed"]["is_symphony_error"]
    assert "RuntimeError: on purpose" in result["failed"]["error"]

    children = final["children"]
    assert {c["id"] for c in children} == {*result["children"], result["bad"]}
    by_id = {c["id"]: c for c in children}
    assert all(
        by_id[c]["status"] == "succeeded" and by_id[c]["entry"] == "agents.reader:main" for c in result["children"]
    )
    assert (by_id[result["bad"]]["status"], by_id[result["bad"]]["entry"]) == ("failed", "self:boom")
    reader = client.get_run(result["children"][0])
    assert (reader["parent"], reader["depth"], reader["worker"]) == (run["id"], 1, final["worker"])
    assert reader["usage"]["cached_tokens"] >= result["results"][0]["context_tokens"] - 1
    listed = client.list_runs(parent=run["id"])
    assert {r["id"] for r in listed} == set(by_id)
    # The CLI shows the same tree.
    shown = _cli(stack_url, api_tenant_a.key_secret, tmp_path, "runs", "show", run["id"], "--human")
    assert f"children ({len(children)}):" in shown and f"{result['bad']}  failed     self:boom" in shown
    ls = json.loads(_cli(stack_url, api_tenant_a.key_secret, tmp_path, "runs", "ls", "--parent", run["id"], "--json"))
    assert {r["id"] for r in ls} == set(by_id)

    # Each run of the tree is billed as a run of the tenant; the invoice is their sum.
    tree = [run["id"], *by_id]
    records = UsageRecord.objects.filter(run_id__in=tree)
    assert records.count() == 4
    month = date.today().strftime("%Y-%m")
    bill = invoice(api_tenant_a.tenant, month)
    lines = {line["item"]: float(line["quantity"]) for line in bill["lines"]}
    assert bill["runs"] == Run.objects.filter(tenant=api_tenant_a.tenant).count() == 4
    for field in ("decode_tokens", "prefill_tokens", "sandbox_seconds"):
        summed = sum(getattr(r, field) for r in records)
        assert lines[field] == pytest.approx(summed), field
    assert sum(r.decode_tokens for r in records if str(r.run_id) != run["id"]) >= 6


def test_spawned_children_exchange_messages_through_the_trees_channels(team, stack_worker, docker_client):
    """A parent and the children it spawned share the tree's channels: the parent queues four
    tasks, each child takes two, generates, and answers on another channel the parent reads."""
    client, program = team
    run = client.create_run(program, args={"mode": "talk"}, limits={"deadline_s": 140})
    final = _finished(client, run["id"])
    assert final["status"] == "succeeded", final["error"]
    result = final["result"]
    assert [a["task"] for a in result["answers"]] == [0, 1, 2, 3]
    assert {a["by"] for a in result["answers"]} <= set(result["children"])
    assert sorted(t for served in result["done"] for t in served) == [0, 1, 2, 3]
    assert all(isinstance(a["text"], str) for a in result["answers"])
    # Every send is a channel event on the sender's stream.
    sent = [e for e in client.events(result["children"][0]) if e.type == "channel"]
    assert sent and all(e.data["channel"] == "answers" for e in sent)
    _nothing_left(stack_worker, docker_client, [run["id"], *result["children"]])


def test_the_swarm_example_shares_one_context_and_hands_off_rounds(stack, api_tenant_a, tree_plan, stack_worker):
    """examples/swarm.py as a tenant would upload it: agents spawned by the coordinator open its
    pinned context read-only (none computes it again), take the rounds from the tree's channel
    and are all heard on the broadcast."""
    from symphony_client import Client

    client = Client(stack, api_tenant_a.key_secret, timeout=60)
    program = client.upload_program(ROOT / "examples" / "swarm.py", name="swarm")
    briefing = " ".join(f"Fact {i}: our product is a tea kettle that whistles in {i} tones." for i in range(8))
    args = {"team": "e2e", "context": briefing, "agents": 3, "rounds": 3}
    run = client.create_run(program["id"], args={**args, "max_tokens": 4}, limits={"deadline_s": 140})
    final = _finished(client, run["id"])
    assert final["status"] == "succeeded", final["error"]
    result = final["result"]
    assert [r["round"] for r in result["rounds"]] == [0, 1, 2]
    agents = result["agents"]
    assert len(agents) == 3 and {a["id"] for a in agents} == {c["id"] for c in final["children"]}
    assert sorted(r for a in agents for r in a["served"]) == [0, 1, 2]
    context_tokens = {a["context_tokens"] for a in agents}
    assert len(context_tokens) == 1 and context_tokens.pop() > 100
    for agent in agents:  # the shared context was read, never recomputed: each prefilled its turns
        usage = client.get_run(agent["id"])["usage"]
        assert usage["cached_tokens"] >= agent["context_tokens"] - 1, usage
        assert usage["prefill_tokens"] < 30 * max(1, len(agent["served"])) < agent["context_tokens"], usage


def test_a_parent_waiting_on_a_channel_learns_its_children_ended(team, stack_worker, docker_client):
    """Every child fails within seconds while the parent waits in ``recv`` with no timeout: the
    message one child sent before failing is returned, then the next ``recv`` (and a
    subscription's) raises ``SendersGone`` naming the children's outcomes, long before the
    deadline."""
    client, program = team
    run = client.create_run(program, args={"mode": "orphaned"}, limits={"deadline_s": 140})
    final = _finished(client, run["id"])
    assert final["status"] == "succeeded", final["error"]
    out = final["result"]
    assert out["first"] == {"partial": "kept"}
    second = out["second"]
    assert isinstance(second, dict), out
    assert (second["reason"], second["closed"]) == ("senders_gone", True)
    assert second["error"].startswith("ECHANCLOSED (channel_recv): no message can come on channel 'results'")
    for child in out["children"]:
        assert f"{child} failed" in second["error"], second["error"]
    assert "RuntimeError: child 1" in second["error"] and "RuntimeError: after reporting" in second["error"]
    assert out["waited"] < 30, out  # children start and fail in seconds; the deadline is 140 s
    assert out["sub"] == "SendersGone"
    assert out["statuses"] == ["failed", "failed", "failed"]
    _nothing_left(stack_worker, docker_client, [run["id"], *out["children"]])


def test_a_run_scoped_file_is_the_trees_and_a_cancelled_parent_leaves_none(
    team, api_tenant_a, api_tenant_b, stack_worker, docker_client, settings
):
    """``run/ctx``: created by the parent, opened by its child, refused under its stored name;
    the parent is cancelled while it holds it, and nothing of it is left: not on the worker, not
    in the store, not in the control plane's mirror, not on the storage meter."""
    from api.models import KVFile, UsageRecord
    from api.services import kvfiles
    from api.services.billing import meter_kv_storage

    settings.SYMPHONY_WORKER_ADMIN_SOCKET = stack_worker.admin_socket  # the mirror's source
    client, program = team
    tenant = api_tenant_a.tenant
    run = client.create_run(program, args={"mode": "scoped"}, limits={"deadline_s": 140})
    seen: dict = {}
    for event in client.events(run["id"]):
        if event.type == "message":
            seen = event.data["data"]
            break
    assert seen["seen"] > 5, seen  # the child read the parent's context
    assert seen["reserved"].startswith("EINVAL (kv_open)") and "reserved for run-scoped" in seen["reserved"]
    stored = f"runtree-{run['id']}--ctx"
    # The module's worker keeps earlier tests' files of the same tenant name: look at run files.
    run_scoped = lambda: [f["name"] for f in stack_worker.admin.kv_list(tenant.slug) if "runtree-" in f["name"]]  # noqa: E731
    assert run_scoped() == [stored]
    kvfiles.sync(tenant)
    mirrored = KVFile.objects.filter(tenant=tenant, name__startswith="runtree-")
    assert list(mirrored.values_list("name", flat=True)) == [stored]

    client.cancel_run(run["id"])
    assert _finished(client, run["id"], timeout=60)["status"] == "cancelled"
    wait_for(lambda: run_scoped() == [], timeout=60, message="the tree's file removed")
    assert not [p for p in Path(stack_worker.kv_store).rglob("*") if "runtree-" in p.name]
    kvfiles.sync(tenant)
    assert not mirrored.exists()

    # A lost worker's mirror row of an ended tree is never billed as stored KV; a tenant's file is.
    # The rows go to another tenant: the cancelled run's own end may still sync this tenant's
    # mirror (earlier tests' files on the module's worker) while the meter runs.
    ledger = api_tenant_b.tenant
    KVFile.objects.create(tenant=ledger, worker="lost", name=f"runtree-{run['id']}--ghost", bytes=1 << 30)
    KVFile.objects.create(tenant=ledger, worker="lost", name="kept", bytes=1 << 30)
    assert meter_kv_storage(now=(uuid.uuid4().int % 10**9) * 300.0) >= 1
    (billed,) = UsageRecord.objects.filter(tenant=ledger, kv_gib_hours__gt=0)
    assert billed.kv_gib_hours == pytest.approx(300 / 3600)  # one GiB for one period, not two
    _nothing_left(stack_worker, docker_client, [run["id"]])


def test_identical_children_holding_one_context_are_billed_equal_shares_of_it(team, api_tenant_a):
    """Page-seconds of a page several runs hold are split among them (proportional set size):
    three identical children holding the parent's context at once are billed alike, a third
    each of what one child holding it alone for as long is billed, in usage and the invoice."""
    from api.models import Plan, UsageRecord
    from api.services.billing import invoice

    Plan.objects.update_or_create(name="trees", defaults={"max_children_per_run": 4})
    client, program = team
    run = client.create_run(program, args={"mode": "shares"}, limits={"deadline_s": 140})
    final = _finished(client, run["id"])
    assert final["status"] == "succeeded", final["error"]
    out = final["result"]
    assert len(set(out["held"])) == 1 and out["held"][0] > 50, out
    ids = [*out["children"], out["solo"]]
    wait_for(lambda: UsageRecord.objects.filter(run_id__in=ids).count() == 4, timeout=60, message="usage")
    page_seconds = {r["id"]: r["usage"]["page_seconds"] for r in (client.get_run(i) for i in ids)}
    together, solo = [page_seconds[i] for i in out["children"]], page_seconds[out["solo"]]
    assert solo > 0, page_seconds
    assert max(together) < 1.5 * min(together), page_seconds  # billed alike, whoever opened first
    assert all(0.2 * solo < each < 0.55 * solo for each in together), page_seconds  # a third each
    assert 0.7 * solo < sum(together) < 1.3 * solo, page_seconds  # the context paid for once
    records = UsageRecord.objects.filter(tenant=api_tenant_a.tenant, run__isnull=False)
    lines = {
        line["item"]: float(line["quantity"])
        for line in invoice(api_tenant_a.tenant, date.today().strftime("%Y-%m"))["lines"]
    }
    assert lines["page_seconds"] == pytest.approx(sum(r.page_seconds for r in records), abs=1e-3)


def test_cancel_reaches_a_child_and_cancelling_the_parent_ends_the_rest(team, stack_worker, docker_client):
    client, program = team
    run = client.create_run(program, args={"mode": "cancel"}, limits={"deadline_s": 140})
    seen: dict = {}
    for event in client.events(run["id"]):
        if event.type == "message":
            seen.update(event.data["data"])
            if "waited" in seen:
                break
    assert (seen["waited"], seen["first"], seen["again"]) == ("cancelled", True, False)
    a, b = seen["children"]
    assert client.get_run(a)["status"] == "cancelled"
    assert client.get_run(b)["status"] == "running"
    client.cancel_run(run["id"])
    assert _finished(client, b, timeout=60)["status"] == "cancelled"
    parent = _finished(client, run["id"], timeout=60)
    assert parent["status"] == "cancelled"
    # The cancelled child's session ended: its usage was recorded like any run's.
    wait_for(lambda: client.get_run(b)["usage"] is not None, timeout=60)
    _nothing_left(stack_worker, docker_client, [run["id"], a, b])


def test_spawn_bombs_are_refused_while_another_tenants_run_succeeds(
    stack, team, api_tenant_b, tmp_path, stack_worker, docker_client
):
    from symphony_client import Client

    client, program = team
    loop = client.create_run(program, args={"mode": "loop"}, limits={"deadline_s": 140})
    other = Client(stack, api_tenant_b.key_secret, timeout=60)
    lip = tmp_path / "hello.py"
    lip.write_bytes(b"import symphony as sy\n\ndef main(args):\n    return sy.detokenize(sy.tokenize('ok'))\n")
    hello = other.upload_program(lip, name="hello")
    b_run = other.create_run(hello["id"], args={}, limits={"deadline_s": 60})

    looped = _finished(client, loop["id"])
    assert looped["status"] == "succeeded", looped["error"]
    assert len(looped["result"]["spawned"]) == 3
    assert "allows 3 children per run (max_children_per_run)" in looped["result"]["error"]
    assert _finished(other, b_run["id"])["status"] == "succeeded"
    # The parent ended: its children, still sleeping, were cancelled with it.
    for child in looped["result"]["spawned"]:
        assert _finished(client, child, timeout=60)["status"] == "cancelled"

    recurse = client.create_run(program, args={"mode": "recurse"}, limits={"deadline_s": 140})
    final = _finished(client, recurse["id"])
    assert final["status"] == "succeeded", final["error"]
    refused = final["result"]["below"]["below"]["refused"]
    assert "2 level(s) deep (max_spawn_depth)" in refused and refused.startswith("EDQUOT")
    every = client.list_runs()
    assert len(every) == 1 + 3 + 3 and {r["status"] for r in every} == {"succeeded", "cancelled"}
    _nothing_left(stack_worker, docker_client, [r["id"] for r in every])


def test_bad_spawns_are_clear_errors(team):
    client, program = team
    stranger = client.create_run(program, args={"mode": "hello"}, limits={"deadline_s": 60})
    assert _finished(client, stranger["id"])["status"] == "succeeded"
    run = client.create_run(program, args={"mode": "bad", "stranger": stranger["id"]}, limits={"deadline_s": 60})
    final = _finished(client, run["id"])
    assert final["status"] == "succeeded", final["error"]
    out = final["result"]
    assert (
        out["unknown_module"].startswith("InvalidArgument") and "bundle has no agents/nope.py" in out["unknown_module"]
    )
    assert out["unknown_function"].startswith("InvalidArgument") and "defines no nowhere" in out["unknown_function"]
    assert out["nan_args"].startswith("InvalidArgument") and "args must be JSON" in out["nan_args"]
    assert out["set_args"].startswith("InvalidArgument") and "args must be JSON" in out["set_args"]
    assert out["nan_on_the_wire"].startswith("InvalidArgument") and "spawn args must be JSON" in out["nan_on_the_wire"]
    assert out["bad_limits"].startswith("InvalidArgument") and "gpus: not a run limit" in out["bad_limits"]
    assert out["not_my_child"].startswith("PermissionDenied") and "not a child this run spawned" in out["not_my_child"]
    assert final["children"] == []


def test_the_asyncio_flavour_spawns_waits_and_cancels(team):
    client, program = team
    run = client.create_run(program, args={"mode": "async"}, limits={"deadline_s": 140})
    final = _finished(client, run["id"])
    assert final["status"] == "succeeded", final["error"]
    out = final["result"]
    assert out["results"] == ["hello", "hello"]
    assert (out["cancelled"], out["waited"]) == (True, "cancelled")
    statuses = {c["id"]: c["status"] for c in final["children"]}
    assert [statuses[i] for i in out["ids"]] == ["succeeded", "succeeded", "cancelled"]
