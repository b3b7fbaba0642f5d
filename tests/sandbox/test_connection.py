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
from symphony.connection import Connection
from symphony.errors import ConnectionLost


class Peer:
    """Answers each request ``{"echo": x, "delay": s}`` with ``x``, after ``s`` seconds, on its
    own thread per request, so replies come back out of order; ``{"never": true}`` gets none."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.requests: queue.Queue[int] = queue.Queue()
        self._send_lock = threading.Lock()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        buf = b""
        while True:
            data = self.sock.recv(65536)
            if not data:
                return
            buf += data
            while len(buf) >= protocol.HEADER_BYTES:
                n = protocol.frame_length(buf[: protocol.HEADER_BYTES])
                if len(buf) < protocol.HEADER_BYTES + n:
                    break
                msg = protocol.unpack_body(buf[protocol.HEADER_BYTES : protocol.HEADER_BYTES + n])
                buf = buf[protocol.HEADER_BYTES + n :]
                req_id, _, args = protocol.parse_request(msg)
                self.requests.put(req_id)
                if not args.get("never"):
                    threading.Thread(target=self._answer, args=(req_id, args), daemon=True).start()

    def _answer(self, req_id: int, args: dict[str, Any]) -> None:
        time.sleep(args.get("delay", 0))
        with self._send_lock:
            try:
                self.sock.sendall(protocol.pack(protocol.ok_reply(req_id, args.get("echo"))))
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


def test_fire_and_forget_replies_are_read_by_the_next_caller(pair) -> None:
    conn, _, _ = pair
    conn.deferred_releases.extend([1, 2, 3])
    conn.flush_releases()  # its reply is left for whoever reads next
    assert conn.call("op", {"echo": "after"}) == "after"
    assert conn._pending == {}  # the release's reply was routed too


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
