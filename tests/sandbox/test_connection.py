"""The SDK connection's reading role, against a scripted peer on a socketpair (no worker).

The worker-backed SDK tests (``test_sdk.py``) show replies reach their callers; these pin down
the leader/follower hand-offs that are hard to provoke there: replies out of order, a caller
timing out while others wait, the role passing to a background reader, and the peer closing.
"""

from __future__ import annotations

import queue
import socket
import threading
import time
from typing import Any

import pytest

from gpu_worker import protocol
from symphony.admission import Admission
from symphony.api import Session
from symphony.connection import Connection
from symphony.errors import Busy, ConnectionLost, KVNotFound


class Peer:
    """Answers each request ``{"echo": x, "delay": s}`` with ``x``, after ``s`` seconds, on its
    own thread per request, so replies come back out of order; ``{"never": true}`` gets none."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.requests: queue.Queue[int] = queue.Queue()
        self.reads = 0
        self._send_lock = threading.Lock()
        #: Requests not yet answered, and the most there were; past the cap: EBUSY, as the worker.
        self.outstanding = 0
        self.max_outstanding = 0
        self._count_lock = threading.Lock()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        buf = b""
        while True:
            try:
                data = self.sock.recv(65536)
            except OSError:  # the fixture closed the socket at teardown
                return
            if not data:
                return
            self.reads += 1
            buf += data
            while len(buf) >= protocol.HEADER_BYTES:
                n = protocol.frame_length(buf[: protocol.HEADER_BYTES])
                if len(buf) < protocol.HEADER_BYTES + n:
                    break
                msg = protocol.unpack_body(buf[protocol.HEADER_BYTES : protocol.HEADER_BYTES + n])
                buf = buf[protocol.HEADER_BYTES + n :]
                req_id, op, args = protocol.parse_request(msg)
                self.requests.put(req_id)
                with self._count_lock:
                    if self.outstanding >= protocol.MAX_IN_FLIGHT:
                        args = {"busy": True}
                    else:
                        self.outstanding += 1
                        self.max_outstanding = max(self.max_outstanding, self.outstanding)
                if op == "pred":  # a fused pred: "choose" the file's id as the next token
                    args = {"echo": {"tokens": [args["kv"]]}}
                if not args.get("never"):
                    threading.Thread(target=self._answer, args=(req_id, args), daemon=True).start()

    def _answer(self, req_id: int, args: dict[str, Any]) -> None:
        time.sleep(args.get("delay", 0))
        if args.get("busy"):
            error = protocol.ProtocolError(protocol.ErrorCode.BUSY, "too many requests in flight")
            with self._send_lock:
                self.sock.sendall(protocol.pack(protocol.err_reply(req_id, error)))
            return
        with self._count_lock:
            self.outstanding -= 1
        if args.get("fail"):
            reply = protocol.err_reply(req_id, protocol.ProtocolError(protocol.ErrorCode.NOT_FOUND, "no such file"))
        else:
            reply = protocol.ok_reply(req_id, args.get("echo"))
        with self._send_lock:
            try:
                self.sock.sendall(protocol.pack(reply))
            except OSError:
                pass


@pytest.fixture
def pair():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    conn, peer = Connection(a), Peer(b)
    yield conn, peer, b
    conn.close()
    b.close()


def run_threads(fns, timeout: float = 20.0) -> list[Any]:
    out: list[Any] = [None] * len(fns)

    def wrap(i, fn):
        try:
            out[i] = fn()
        except BaseException as exc:
            out[i] = exc

    threads = [threading.Thread(target=wrap, args=(i, fn)) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), "a caller is stuck: the reading role was lost"
    return out


def test_a_single_thread_reads_its_own_replies(pair) -> None:
    conn, _, _ = pair
    assert [conn.call("op", {"echo": i}) for i in range(50)] == list(range(50))
    assert conn._reader is None  # no reader thread was needed


def test_threads_get_their_own_replies_when_they_arrive_out_of_order(pair) -> None:
    conn, _, _ = pair
    # Later requests answer first: the reader of the moment must hand replies to the others.
    fns = [
        lambda i=i: [conn.call("op", {"echo": (i, k), "delay": 0.002 * (8 - i)}) for k in range(20)] for i in range(8)
    ]
    results = run_threads(fns)
    assert results == [[[i, k] for k in range(20)] for i in range(8)]
    assert conn._reader is None


def test_a_caller_timing_out_passes_the_role_on(pair) -> None:
    """The reader times out on a reply that never comes; the callers waiting behind it still
    get theirs (one of them takes the role)."""
    conn, _, _ = pair
    started = threading.Event()

    def stuck():
        started.set()
        return conn.call("op", {"never": True}, timeout=0.3)

    def later(i):
        started.wait()
        time.sleep(0.05)
        return conn.call("op", {"echo": i, "delay": 0.5})

    results = run_threads([stuck, *[lambda i=i: later(i) for i in range(3)]])
    assert isinstance(results[0], TimeoutError)
    assert results[1:] == [0, 1, 2]


def test_submit_hands_the_role_to_a_reader_thread(pair) -> None:
    conn, _, _ = pair
    assert conn.call("op", {"echo": "first"}) == "first"
    futures = [conn.submit("op", {"echo": i, "delay": 0.01 * (5 - i)}) for i in range(5)]
    assert [f.result(5) for f in futures] == list(range(5))  # nobody waits in call()
    assert conn._reader is not None and conn._reader.is_alive()
    assert run_threads([lambda i=i: conn.call("op", {"echo": i}) for i in range(4)]) == [0, 1, 2, 3]


def test_call_many_sends_one_write_and_returns_replies_in_request_order(pair) -> None:
    conn, peer, _ = pair
    # Earlier requests answer last: the replies are matched by id, not by arrival.
    requests = [("op", {"echo": i, "delay": 0.01 * (8 - i)}) for i in range(8)]
    assert conn.call_many(requests) == list(range(8))
    assert peer.reads == 1  # all eight frames arrived in one piece
    assert conn.call_many([]) == []
    assert conn._pending == {}


def test_call_many_raises_the_first_failure_after_every_reply_is_in(pair) -> None:
    conn, _, _ = pair
    with pytest.raises(KVNotFound):
        conn.call_many([("op", {"echo": 0, "delay": 0.2}), ("op", {"fail": True}), ("op", {"echo": 2})])
    assert conn._pending == {}  # the slow reply was waited for, not left behind


def test_call_many_shares_the_connection_with_threads_calling_one_by_one(pair) -> None:
    conn, _, _ = pair
    batches = [[("op", {"echo": (i, k), "delay": 0.001 * k}) for k in range(6)] for i in range(3)]
    many = [lambda b=b: conn.call_many(b) for b in batches]
    single = [lambda i=i: [conn.call("op", {"echo": i, "delay": 0.002}) for _ in range(5)] for i in range(3)]
    results = run_threads(many + single)
    assert results[:3] == [[[i, k] for k in range(6)] for i in range(3)]
    assert results[3:] == [[i] * 5 for i in range(3)]


def test_pred_token_many_sends_no_more_than_the_in_flight_cap_per_write(pair) -> None:
    conn, peer, _ = pair
    n = conn.admission.cap + 6
    assert conn.admission.cap == protocol.MAX_IN_FLIGHT - 1  # one slot kept for dist_release
    assert Session(conn).pred_token_many([(kv, [1, 2]) for kv in range(n)]) == list(range(n))
    assert peer.reads == 2  # 63 calls, their replies, then the other 6


def test_fire_and_forget_replies_are_read_by_the_next_caller(pair) -> None:
    conn, _, _ = pair
    conn.deferred_releases.extend([1, 2, 3])
    conn.flush_releases()  # its reply is left for whoever reads next
    # The peer answers each request on its own thread: the echo waits, so the release's reply is
    # on the socket before it (without the delay the two raced, and a release answered second
    # was rightly still pending when the caller had its own reply).
    assert conn.call("op", {"echo": "after", "delay": 0.5}) == "after"
    assert conn._pending == {}  # the release's reply, read first, was routed too


def test_the_peer_closing_fails_every_waiting_caller(pair) -> None:
    conn, peer, peer_sock = pair

    def close_soon():
        for _ in range(3):
            peer.requests.get(timeout=5)
        peer_sock.shutdown(socket.SHUT_RDWR)

    threading.Thread(target=close_soon, daemon=True).start()
    results = run_threads([lambda: conn.call("op", {"never": True}) for _ in range(3)])
    assert all(isinstance(r, ConnectionLost) for r in results), results
    with pytest.raises(ConnectionLost):
        conn.call("op", {"echo": 1})


def test_threads_past_the_in_flight_cap_queue_instead_of_getting_busy(pair) -> None:
    """256 threads, more than the worker's 64 calls in flight: each waits its turn for a slot."""
    conn, peer, _ = pair
    fns = [lambda i=i: [conn.call("op", {"echo": (i, k), "delay": 0.005}) for k in range(3)] for i in range(256)]
    assert run_threads(fns, timeout=60) == [[[i, k] for k in range(3)] for i in range(256)]
    assert 1 < peer.max_outstanding <= protocol.MAX_IN_FLIGHT  # concurrent, never past the cap
    assert conn.admission.in_flight == 0 and conn._pending == {}


def test_a_caller_that_will_not_wait_gets_busy_at_once_without_sending(pair) -> None:
    conn, peer, _ = pair
    futures = [conn.submit("op", {"never": True}) for _ in range(conn.admission.cap)]
    sent = peer.requests.qsize()
    t0 = time.monotonic()
    with pytest.raises(Busy, match="wait=True to queue"):
        conn.call("op", {"echo": 1}, wait=False)
    conn.wait_for_room = False
    with pytest.raises(Busy):
        conn.call("op", {"echo": 1})
    assert time.monotonic() - t0 < 1 and peer.requests.qsize() == sent
    conn.wait_for_room = True
    with pytest.raises(TimeoutError, match="no room"):
        conn.call("op", {"echo": 1}, timeout=0.2)  # waiting for room counts against the timeout
    conn.close()
    for f in futures:
        assert isinstance(f.exception(5), ConnectionLost)


def test_waiters_for_room_fail_when_the_connection_closes(pair) -> None:
    conn, _, _ = pair
    for _ in range(conn.admission.cap):
        conn.submit("op", {"never": True})
    threading.Timer(0.2, conn.close).start()
    with pytest.raises(ConnectionLost):
        conn.call("op", {"echo": 1})


def test_room_is_handed_out_in_the_order_threads_asked() -> None:
    gate = Admission(1)
    gate.acquire()
    order: list[int] = []
    threads = []
    for i in range(5):
        t = threading.Thread(target=lambda i=i: (gate.acquire(), order.append(i), gate.release()))
        t.start()
        threads.append(t)
        deadline = time.monotonic() + 5
        while sum(len(q) for q in gate._queue.values()) < i + 1 and time.monotonic() < deadline:
            time.sleep(0.001)
    gate.release()
    for t in threads:
        t.join(5)
    assert order == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="exceed the in-flight cap"):
        gate.acquire(2)
