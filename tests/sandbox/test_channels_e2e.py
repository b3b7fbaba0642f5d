"""Channels end to end: LIPs in gVisor sandboxes, on the real worker, exchanging messages.

Two concurrent runs of one tree (a coordinator with the threaded SDK, an agent with asyncio)
hand a task and its generated answer through queues and a broadcast; a run of another tenant
given the same tree id reads nothing of theirs; inside the sandbox the bounds surface as the
SDK's named errors. Spawn is not merged yet, so the tree is given to ``create_session``
directly (``LIPRunner.run(tree=...)``), as the executor will for a spawned child."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.docker, pytest.mark.timeout(300)]

COORDINATOR = """
import symphony as sy

def main(args):
    stop = sy.channel("stop")
    sy.channel("tasks").send({"prompt": args["prompt"], "max_tokens": 6})
    ready = sy.channel("ready").recv(timeout=60)          # the agent subscribed to "stop"
    answer = sy.channel("answers").recv_message(timeout=60)
    reached = stop.publish({"stop": True})
    return {"ready": ready, "answer": answer.data, "answer_from": answer.sender, "stop_reached": reached}
"""

AGENT = """
import asyncio
import symphony as sy
from symphony import aio

async def main(args):
    s = await aio.connect()
    stop = await s.channel("stop").subscribe()
    await s.channel("ready").send("agent ready")
    task = await s.channel("tasks").recv(timeout=60)
    kv = await s.kv_create()
    out = await s.generate(kv, await s.tokenize(task["prompt"]), max_tokens=task["max_tokens"])
    await s.channel("answers").send({"tokens": out, "text": await s.detokenize(out)})
    bad = {}
    try:
        await s.channel("answers").send("x" * 70_000)
    except sy.MessageTooLarge as exc:
        bad["too_large"] = exc.reason
    try:
        await s.channel("answers").send({"not": {1, 2}})
    except sy.InvalidArgument as exc:
        bad["not_json"] = type(exc).__name__
    try:
        s.channel("other-tree/answers")
    except sy.InvalidArgument as exc:
        bad["outside"] = type(exc).__name__
    q = s.channel("backlog")
    try:
        for i in range(1000):
            await q.send(i)
    except sy.ChannelFull as exc:
        bad["full_after"] = i
    try:
        await s.channel("silence").recv(timeout=0.2)
    except sy.ChannelTimeout as exc:
        bad["timeout"] = exc.reason
    stopped = await stop.recv(timeout=60)
    return {"stopped": stopped, "bad": bad}
"""

OUTSIDER = """
import symphony as sy

def main(args):
    try:
        got = sy.channel("tasks").recv(timeout=3)
    except sy.ChannelTimeout:
        return {"read": None}
    return {"read": got}
"""


def test_two_sandboxed_runs_of_one_tree_exchange_messages_and_others_see_nothing(lip_runner) -> None:
    tenant, tree = f"t-{uuid.uuid4().hex[:8]}", f"root-{uuid.uuid4().hex[:8]}"
    before = lip_runner.worker.admin.stats()["channels"]
    coordinator_run = f"r-{uuid.uuid4().hex[:8]}"
    agent_run = f"r-{uuid.uuid4().hex[:8]}"
    runs = _run_all(
        lip_runner,
        {
            "coordinator": {
                "program": COORDINATOR,
                "args": {"prompt": "The capital of France is"},
                "tenant": tenant,
                "tree": tree,
                "run_id": coordinator_run,
            },
            "agent": {"program": AGENT, "tenant": tenant, "tree": tree, "run_id": agent_run},
            # another tenant that names the same tree id: a tree is (tenant, tree), never shared
            "outsider": {"program": OUTSIDER, "tree": tree},
        },
    )
    for name, run in runs.items():
        assert not isinstance(run, BaseException), (name, run)
        assert run.result.status == "succeeded", (name, run.result.error, run.result.stderr[-2000:])
    coord, agent = runs["coordinator"].result.result, runs["agent"].result.result
    assert coord["ready"] == "agent ready"
    assert coord["answer_from"] == agent_run
    assert 1 <= len(coord["answer"]["tokens"]) <= 6 and isinstance(coord["answer"]["text"], str)
    assert coord["stop_reached"] == 1
    assert agent["stopped"] == {"stop": True}
    assert agent["bad"] == {
        "too_large": "message_too_large",
        "not_json": "InvalidArgument",
        "outside": "InvalidArgument",
        "full_after": 256,
        "timeout": "channel_timeout",
    }
    assert runs["outsider"].result.result == {"read": None}
    # the tree ended with its runs: its channels, the backlog of 256 and the subscription are gone
    after = lip_runner.worker.admin.stats()["channels"]
    for key in ("trees", "channels", "subscriptions", "queued_bytes"):
        assert after[key] == before[key], (key, before, after)


def _run_all(lip_runner: Any, jobs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}

    def one(name: str, kw: dict[str, Any]) -> None:
        try:
            out[name] = lip_runner.run(**kw)
        except BaseException as exc:
            out[name] = exc

    threads = [threading.Thread(target=one, args=(n, kw)) for n, kw in jobs.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    return out
