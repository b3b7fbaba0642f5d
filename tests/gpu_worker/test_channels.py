"""The channel broker (gpu_worker/channels.py) on its own event loop: queue and broadcast
delivery, every bound with its error code, isolation between trees and tenants, waiting reads
that leave the loop free, and cleanup when a tree's last session leaves."""

from __future__ import annotations

import asyncio
import time

import pytest

from gpu_worker import channels
from gpu_worker.channels import ChannelBroker, Member
from gpu_worker.protocol import MAX_CHANNEL_MESSAGE_BYTES, ErrorCode, ProtocolError


def member(n: int, tenant: str = "t1", tree: str = "root") -> Member:
    return Member(session_id=f"s{n}", tenant=tenant, tree=tree, run_id=f"run{n}")


def code_of(fn, *args) -> str:
    with pytest.raises(ProtocolError) as err:
        fn(*args)
    return err.value.code


async def acode_of(aw) -> str:
    with pytest.raises(ProtocolError) as err:
        await aw
    return err.value.code


def broker_with(*members: Member, **kw: int) -> ChannelBroker:
    b = ChannelBroker(**kw)
    for m in members:
        b.join(m)
    return b


def test_send_then_recv_in_order_with_the_sender() -> None:
    a, b = member(1), member(2)
    broker = broker_with(a, b)

    async def go() -> list:
        broker.send(a, "jobs", {"n": 1})
        broker.send(a, "jobs", [2, "zwei"])
        return [await broker.recv(b, "jobs", 1.0), await broker.recv(b, "jobs", 1.0)]

    got = asyncio.run(go())
    assert [m.data for m in got] == [{"n": 1}, [2, "zwei"]]
    assert {m.sender for m in got} == {"run1"}
    assert broker.tenant_bytes("t1") == 0


def test_a_waiting_recv_gets_a_later_send_and_leaves_the_loop_free() -> None:
    a, b = member(1), member(2)
    broker = broker_with(a, b)

    async def go() -> tuple:
        reader = asyncio.create_task(broker.recv(b, "x", 5.0))
        ticks = 0
        for _ in range(5):  # the loop keeps running while the read waits
            await asyncio.sleep(0.01)
            ticks += 1
        broker.send(a, "x", "hi")
        return (await reader).data, ticks

    assert asyncio.run(go()) == ("hi", 5)
    assert broker.tenant_bytes("t1") == 0  # handed off, never queued


def test_recv_times_out_with_its_own_code() -> None:
    broker = broker_with(member(1))
    started = time.monotonic()
    assert asyncio.run(acode_of(broker.recv(member(1), "quiet", 0.05))) == ErrorCode.CHANNEL_TIMEOUT
    assert time.monotonic() - started < 2


def test_trees_and_tenants_do_not_share_channels() -> None:
    a = member(1)
    same_tree_other_tenant = member(2, tenant="t2")
    other_tree = member(3, tree="other")
    mate = member(4)
    broker = broker_with(a, same_tree_other_tenant, other_tree, mate)
    broker.send(a, "secret", "for my tree only")

    async def go() -> None:
        assert await acode_of(broker.recv(same_tree_other_tenant, "secret", 0.02)) == ErrorCode.CHANNEL_TIMEOUT
        assert await acode_of(broker.recv(other_tree, "secret", 0.02)) == ErrorCode.CHANNEL_TIMEOUT
        assert (await broker.recv(mate, "secret", 0.02)).data == "for my tree only"

    asyncio.run(go())


@pytest.mark.parametrize("name", ["", "other/x", "../x", "..", "a b", "x" * 129, "tree:root/x", "é"])
def test_a_name_that_is_not_a_local_channel_name_is_refused(name: str) -> None:
    a = member(1)
    broker = broker_with(a)
    assert code_of(broker.send, a, name, 1) == ErrorCode.BAD_ARGS


def test_values_must_be_json_and_small() -> None:
    a = member(1)
    broker = broker_with(a)
    assert code_of(broker.send, a, "c", b"raw") == ErrorCode.BAD_ARGS
    assert code_of(broker.send, a, "c", float("nan")) == ErrorCode.BAD_ARGS
    big = "x" * MAX_CHANNEL_MESSAGE_BYTES  # plus its quotes: two bytes over
    assert code_of(broker.send, a, "c", big) == ErrorCode.MESSAGE_TOO_LARGE
    assert code_of(broker.publish, a, "c", big) == ErrorCode.MESSAGE_TOO_LARGE
    broker.send(a, "c", "x" * (MAX_CHANNEL_MESSAGE_BYTES - 2))
    assert broker.tenant_bytes("t1") == MAX_CHANNEL_MESSAGE_BYTES


def test_a_full_queue_refuses_and_recovers_when_read() -> None:
    a = member(1)
    broker = broker_with(a)
    for i in range(channels.MAX_QUEUED):
        broker.send(a, "q", i)
    assert code_of(broker.send, a, "q", "one more") == ErrorCode.CHANNEL_FULL
    assert asyncio.run(broker.recv(a, "q", 0)).data == 0
    broker.send(a, "q", "now there is room")


def test_the_tenants_queued_bytes_are_bounded_across_trees() -> None:
    a, other = member(1), member(2, tree="t-b")
    broker = broker_with(a, other, max_tenant_bytes=100)
    broker.send(a, "c", "x" * 58)  # 60 bytes as JSON
    assert code_of(broker.send, other, "c", "x" * 48) == ErrorCode.CHANNEL_FULL  # 50 more: 110 > 100
    b2 = member(3, tenant="t2")
    broker.join(b2)
    broker.send(b2, "c", "x" * 48)  # another tenant has its own bound


def test_too_many_channels_in_a_tree() -> None:
    a = member(1)
    broker = broker_with(a)
    for i in range(channels.MAX_CHANNELS):
        broker.send(a, f"c{i}", i)
    assert code_of(broker.send, a, "one-too-many", 0) == ErrorCode.TOO_MANY_CHANNELS
    broker.send(a, "c0", "an existing one still works")
    assert code_of(broker.send, member(2, tree="t2"), "x", 0) == ErrorCode.CHANNEL_CLOSED  # not a member


def test_publish_reaches_every_subscriber_made_before_it() -> None:
    a, b, c = member(1), member(2), member(3)
    broker = broker_with(a, b, c)

    async def go() -> tuple:
        assert broker.publish(a, "news", "nobody hears this") == 0
        sb = broker.subscribe(b, "news")
        sc = broker.subscribe(c, "news")
        waiting = asyncio.create_task(broker.next(c, sc, 1.0))
        await asyncio.sleep(0)
        assert broker.publish(a, "news", {"round": 1}) == 2
        assert broker.publish(a, "news", {"round": 2}) == 2
        got_b = [(await broker.next(b, sb, 1.0)).data for _ in range(2)]
        got_c = [(await waiting).data, (await broker.next(c, sc, 1.0)).data]
        return got_b, got_c

    got_b, got_c = asyncio.run(go())
    assert got_b == got_c == [{"round": 1}, {"round": 2}]
    assert broker.tenant_bytes("t1") == 0


def test_a_slow_subscriber_refuses_the_whole_publish() -> None:
    a, b, c = member(1), member(2), member(3)
    broker = broker_with(a, b, c)
    sb = broker.subscribe(b, "news")
    broker.subscribe(c, "news")
    for i in range(channels.MAX_QUEUED):
        broker.publish(a, "news", i)
    assert code_of(broker.publish, a, "news", "over") == ErrorCode.CHANNEL_FULL
    asyncio.run(broker.next(b, sb, 0))  # b reads one; c is still full
    assert code_of(broker.publish, a, "news", "over") == ErrorCode.CHANNEL_FULL


def test_subscriptions_are_the_sessions_own_and_bounded() -> None:
    a, b = member(1), member(2)
    broker = broker_with(a, b)
    sub = broker.subscribe(a, "news")
    assert asyncio.run(acode_of(broker.next(b, sub, 0))) == ErrorCode.NOT_FOUND
    broker.unsubscribe(a, sub)
    assert code_of(broker.unsubscribe, a, sub) == ErrorCode.NOT_FOUND
    for _ in range(channels.MAX_SUBSCRIPTIONS):
        broker.subscribe(a, "news")
    assert code_of(broker.subscribe, a, "news") == ErrorCode.TOO_MANY_CHANNELS


def test_close_drains_then_refuses() -> None:
    a, b = member(1), member(2)
    broker = broker_with(a, b)

    async def go() -> None:
        waiting = asyncio.create_task(broker.recv(b, "other", 5.0))
        await asyncio.sleep(0)
        broker.close(a, "other")
        assert await acode_of(waiting) == ErrorCode.CHANNEL_CLOSED  # a waiting reader fails at once
        broker.send(a, "done", 1)
        broker.close(a, "done")
        assert (await broker.recv(b, "done", 0)).data == 1  # what was queued is still read
        assert await acode_of(broker.recv(b, "done", 0)) == ErrorCode.CHANNEL_CLOSED
        assert code_of(broker.send, a, "done", 2) == ErrorCode.CHANNEL_CLOSED

    asyncio.run(go())


def test_the_last_session_of_a_tree_frees_everything() -> None:
    a, b = member(1), member(2)
    broker = broker_with(a, b)
    broker.send(a, "q", "x" * 1000)
    broker.subscribe(b, "news")
    broker.publish(a, "news", "y" * 1000)
    broker.leave("s2")  # b's subscription and its queued copy go; the tree lives on
    assert broker.stats()["subscriptions"] == 0
    assert broker.stats()["trees"] == 1
    assert broker.tenant_bytes("t1") == 1002
    broker.leave("s1")
    assert broker.stats() == {
        "trees": 0,
        "channels": 0,
        "subscriptions": 0,
        "queued_bytes": 0,
        "sent": 1,
        "published": 1,
    }
    assert broker.tenant_bytes("t1") == 0
    assert code_of(broker.send, a, "q", 1) == ErrorCode.CHANNEL_CLOSED  # an ended session's channels are gone


def test_a_reader_waiting_when_its_session_leaves_is_failed() -> None:
    a = member(1)
    broker = broker_with(a)

    async def go() -> str:
        sub = broker.subscribe(a, "news")
        waiting = asyncio.create_task(broker.next(a, sub, 5.0))
        await asyncio.sleep(0)
        broker.leave("s1")
        return await acode_of(waiting)

    assert asyncio.run(go()) == ErrorCode.CHANNEL_CLOSED


def test_a_message_sent_as_a_waiting_reader_leaves_goes_to_a_live_one() -> None:
    """The worker fails a leaving session's reads before their tasks are cancelled: a send in
    between is queued for the tree's live readers, not handed to the dying one and lost."""
    a, b, c = member(1), member(2), member(3)
    broker = broker_with(a, b, c)

    async def go() -> tuple:
        dying = asyncio.create_task(broker.recv(b, "x", 5.0))
        await asyncio.sleep(0)
        broker.leave("s2")
        broker.send(a, "x", "for someone alive")
        return await acode_of(dying), (await broker.recv(c, "x", 1.0)).data

    assert asyncio.run(go()) == (ErrorCode.CHANNEL_CLOSED, "for someone alive")
    assert broker.stats()["trees"] == 1
