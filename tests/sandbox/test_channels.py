"""Channels between the runs of one tree (gpu_worker/channels.py) through the real worker and
the ``symphony`` SDK over real session sockets: two sessions of one tree exchange messages both
ways (threaded and asyncio SDK), another tree or tenant cannot read them, every bound answers
its own error, a waiting ``recv`` holds neither the worker's loop nor other runs, sends are
``channel`` events on the sender's stream, and the tree's end frees everything.

The sandboxed form (two LIPs in gVisor) is tests/sandbox/test_channels_e2e.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

import symphony as sy
from gpu_worker import channels, protocol
from symphony import aio
from tests.conftest import redis_db_url, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.timeout(180)]


@contextlib.contextmanager
def sessions(worker: Any, n: int, *, tenant: str | None = None, tree: str | None = None, **limits: Any) -> Iterator:
    """``n`` connected sessions of one tenant and one tree (fresh ones unless given)."""
    tenant = tenant or f"t-{uuid.uuid4().hex[:8]}"
    tree = tree or f"tree-{uuid.uuid4().hex[:8]}"
    infos = [worker.create_session(tenant, f"r-{uuid.uuid4().hex[:8]}", tree=tree, **limits) for _ in range(n)]
    conns = [sy.connect(i.socket_path, i.token) for i in infos]
    try:
        yield conns
    finally:
        for c in conns:
            c.close()
        for i in infos:
            with contextlib.suppress(Exception):
                worker.end_session(i.session_id)


def channel_stats(worker: Any) -> dict[str, int]:
    return worker.admin.stats()["channels"]


def test_two_runs_of_one_tree_exchange_messages(gpu_worker_process) -> None:
    with sessions(gpu_worker_process, 2) as (a, b):
        a.channel("jobs").send({"task": "summarise", "n": 1})
        a.channel("jobs").send(["zwei", 2.5, None, True])
        got = b.channel("jobs").recv_message(timeout=5)
        assert got.data == {"task": "summarise", "n": 1}
        assert got.sender == a.info.run_id
        assert b.channel("jobs").recv(timeout=5) == ["zwei", 2.5, None, True]
        # the other way, with a receiver already waiting when the message is sent
        reply: list[Any] = []
        waiting = threading.Thread(target=lambda: reply.append(a.channel("replies").recv(timeout=10)))
        waiting.start()
        time.sleep(0.3)
        b.channel("replies").send("done: ü")
        waiting.join(15)
        assert reply == ["done: ü"]


def test_asyncio_runs_exchange_and_broadcast(gpu_worker_process) -> None:
    tenant, tree = f"t-{uuid.uuid4().hex[:8]}", f"tree-{uuid.uuid4().hex[:8]}"
    infos = [gpu_worker_process.create_session(tenant, tree=tree) for _ in range(3)]

    async def go() -> tuple:
        coord, *agents = [await aio.connect(i.socket_path, i.token) for i in infos]
        try:
            subs = [await s.channel("round").subscribe() for s in agents]
            assert await coord.channel("round").publish({"round": 1}) == 2
            assert await coord.channel("round").publish({"round": 2}) == 2
            heard = [[await sub.recv(timeout=5) for _ in range(2)] for sub in subs]
            # each agent answers on one queue; the coordinator reads both answers
            await asyncio.gather(*(s.channel("answers").send({"from": s.info.run_id}) for s in agents))
            answers = [await coord.channel("answers").recv(timeout=5) for _ in agents]
            await coord.channel("round").close()
            ends = [[m async for m in sub] for sub in subs]  # iteration ends at the close
            return heard, answers, ends, [s.info.run_id for s in agents]
        finally:
            for s in (coord, *agents):
                s.close()

    try:
        heard, answers, ends, agent_runs = asyncio.run(go())
    finally:
        for i in infos:
            gpu_worker_process.end_session(i.session_id)
    assert heard == [[{"round": 1}, {"round": 2}]] * 2
    assert sorted(a["from"] for a in answers) == sorted(agent_runs)
    assert ends == [[], []]


def test_another_tree_or_tenant_cannot_read_a_trees_messages(gpu_worker_process) -> None:
    tenant, tree = f"t-{uuid.uuid4().hex[:8]}", f"tree-{uuid.uuid4().hex[:8]}"
    with (
        sessions(gpu_worker_process, 1, tenant=tenant, tree=tree) as (sender,),
        sessions(gpu_worker_process, 1, tenant=tenant) as (other_tree,),
        sessions(gpu_worker_process, 1, tree=tree) as (other_tenant,),  # same tree id, another tenant
        sessions(gpu_worker_process, 1, tenant=tenant, tree=tree) as (mate,),
    ):
        sender.channel("secret").send("for my tree only")
        for outsider in (other_tree, other_tenant):
            with pytest.raises(sy.ChannelTimeout):
                outsider.channel("secret").recv(timeout=0.2)
        with pytest.raises(sy.InvalidArgument, match="local to this run's tree"):
            other_tree.channel(f"{tree}/secret")  # no name reaches another tree's channel
        # the worker refuses such a name too (a LIP that skips the SDK's check)
        with pytest.raises(sy.InvalidArgument, match="local to the caller's run tree"):
            other_tree.conn.call("channel_recv", {"name": f"{tree}/secret", "timeout": 0})
        assert mate.channel("secret").recv(timeout=5) == "for my tree only"


def test_bounds_answer_their_own_errors(gpu_worker_process) -> None:
    with sessions(gpu_worker_process, 2) as (a, b):
        big = "x" * protocol.MAX_CHANNEL_MESSAGE_BYTES
        with pytest.raises(sy.MessageTooLarge):
            a.channel("c").send(big)  # refused by the SDK before it is sent
        with pytest.raises(sy.MessageTooLarge):
            a.conn.call("channel_send", {"name": "c", "data": big})  # and by the worker
        with pytest.raises(sy.InvalidArgument, match="JSON"):
            a.conn.call("channel_send", {"name": "c", "data": float("nan")})
        with pytest.raises(sy.InvalidArgument, match="JSON"):
            a.channel("c").send({"raw": b"bytes"})
        q = a.channel("q")
        for i in range(channels.MAX_QUEUED):
            q.send(i)
        with pytest.raises(sy.ChannelFull) as full:
            q.send("one too many")
        assert full.value.reason == "channel_full" and isinstance(full.value, sy.NoSpace)
        assert b.channel("q").recv(timeout=1) == 0
        q.send("room again")
        for i in range(channels.MAX_CHANNELS - 2):  # "c" was never made (refused sends); "q" was
            a.channel(f"c{i}").send(i)
        b.channel("last").send(0)  # the tree's 64th
        with pytest.raises(sy.TooManyChannels):
            b.channel("one-too-many").send(0)
        assert b.channel("c0").recv(timeout=0.1) == 0
        with pytest.raises(sy.ChannelTimeout) as late:
            b.channel("c0").recv(timeout=0.1)
        assert isinstance(late.value, TimeoutError)


def test_recv_times_out_and_a_closed_channel_says_so(gpu_worker_process) -> None:
    with sessions(gpu_worker_process, 2) as (a, b):
        started = time.monotonic()
        with pytest.raises(sy.ChannelTimeout, match=r"within 0\.3 s"):
            a.channel("nobody").recv(timeout=0.3)
        assert 0.25 < time.monotonic() - started < 5
        b.channel("done").send("last words")
        b.channel("done").close()
        assert a.channel("done").recv(timeout=1) == "last words"
        with pytest.raises(sy.ChannelClosed):
            a.channel("done").recv(timeout=1)
        with pytest.raises(sy.ChannelClosed):
            b.channel("done").send("too late")


def test_the_runs_deadline_bounds_a_recv(gpu_worker_process) -> None:
    with sessions(gpu_worker_process, 1, deadline_s=1.0) as (a,):
        started = time.monotonic()
        with pytest.raises(sy.DeadlineExceeded, match="deadline"):
            a.channel("forever").recv()
        assert time.monotonic() - started < 5


def test_a_waiting_recv_blocks_neither_the_worker_nor_other_runs(gpu_worker_process) -> None:
    with sessions(gpu_worker_process, 1) as (waiter,), sessions(gpu_worker_process, 1) as (busy,):
        outcome: list[BaseException] = []

        def wait() -> None:
            try:
                waiter.channel("x").recv(timeout=8)
            except BaseException as exc:
                outcome.append(exc)

        blocked = threading.Thread(target=wait)
        blocked.start()
        time.sleep(0.2)
        started = time.monotonic()
        kv = busy.kv_create()
        out = busy.generate(kv, busy.tokenize("The capital of France is"), max_tokens=8)
        assert len(out) >= 1
        assert gpu_worker_process.admin.health()["ok"]
        assert time.monotonic() - started < 6  # well inside the waiting read's 8 s
        blocked.join(15)
        assert len(outcome) == 1 and isinstance(outcome[0], sy.ChannelTimeout), outcome


def test_sends_are_channel_events_on_the_senders_stream(gpu_worker_process) -> None:
    events = redis.Redis.from_url(redis_db_url(0))
    with sessions(gpu_worker_process, 2) as (a, b):
        sub = b.channel("news").subscribe()
        a.channel("votes").send({"agent": 1, "say": "ja"})
        assert a.channel("news").publish(["ü"]) == 1
        assert sub.recv(timeout=5) == ["ü"]
        stream = f"run:{a.info.run_id}"

        def channel_events() -> list[dict]:
            return [json.loads(f[b"data"]) for _, f in events.xrange(stream) if f[b"type"] == b"channel"]

        wait_for(lambda: len(channel_events()) == 2, timeout=10, message="two channel events")
        assert channel_events() == [
            {"channel": "votes", "op": "send", "data": {"agent": 1, "say": "ja"}, "bytes": 22},
            {"channel": "news", "op": "publish", "data": ["ü"], "bytes": 6},
        ]
        assert not [f for _, f in events.xrange(f"run:{b.info.run_id}") if f[b"type"] == b"channel"]
        events.delete(stream)


def test_the_trees_end_frees_its_channels_and_queues(gpu_worker_process) -> None:
    before = channel_stats(gpu_worker_process)
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    with sessions(gpu_worker_process, 2, tenant=tenant) as (a, b):
        for _ in range(10):
            a.channel("backlog").send("y" * 1000)
        a.channel("news").subscribe()
        b.channel("news").subscribe()
        a.channel("news").publish("z" * 1000)
        held = channel_stats(gpu_worker_process)
        assert held["trees"] == before["trees"] + 1
        assert held["queued_bytes"] >= before["queued_bytes"] + 12_000
    after = channel_stats(gpu_worker_process)
    for key in ("trees", "channels", "subscriptions", "queued_bytes"):
        assert after[key] == before[key], (key, before, after)


def test_a_recv_waiting_when_its_run_is_ended_fails_clearly(gpu_worker_process) -> None:
    """The control plane ends a session (a cancel, the deadline reaper) while its LIP waits in
    ``recv``: the wait ends at once with ``ConnectionLost`` (the socket closed), not a hang, and
    a run of the tree still alive finds its channels working; the tree's last end frees them."""
    before = channel_stats(gpu_worker_process)
    tenant, tree = f"t-{uuid.uuid4().hex[:8]}", f"tree-{uuid.uuid4().hex[:8]}"
    ended = gpu_worker_process.create_session(tenant, tree=tree)
    survivor = gpu_worker_process.create_session(tenant, tree=tree)
    waiter = sy.connect(ended.socket_path, ended.token)
    alive = sy.connect(survivor.socket_path, survivor.token)
    outcome: list[BaseException] = []

    def wait() -> None:
        try:
            waiter.channel("never").recv(timeout=60)
        except BaseException as exc:
            outcome.append(exc)

    blocked = threading.Thread(target=wait)
    blocked.start()
    time.sleep(0.3)
    started = time.monotonic()
    gpu_worker_process.end_session(ended.session_id)
    blocked.join(10)
    assert not blocked.is_alive() and time.monotonic() - started < 5
    assert len(outcome) == 1 and isinstance(outcome[0], sy.ConnectionLost), outcome
    alive.channel("still").send(1)
    assert alive.channel("still").recv(timeout=1) == 1
    waiter.close()
    alive.close()
    gpu_worker_process.end_session(survivor.session_id)
    after = channel_stats(gpu_worker_process)
    for key in ("trees", "channels", "subscriptions", "queued_bytes"):
        assert after[key] == before[key], (key, before, after)
