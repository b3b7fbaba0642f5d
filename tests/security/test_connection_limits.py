"""A LIP's session socket cannot take the worker down (docs/ARCHITECTURE.md §4, §9; gpu_worker/connections.py).

Each test attacks the real worker process (tests/plugins/worker.py) over raw Unix sockets, the
way hostile code in a sandbox can, and checks (a) the attacker's own clear outcome (an error
frame, a closed connection, a stalled write) and (b) that another tenant's session, driven
through the SDK meanwhile, still gets its tokens within a bound. The worker's memory and open
descriptors are read from /proc. Everything is bounded in count and time and stops itself.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

import symphony as sy
from gpu_worker import protocol
from gpu_worker.config import ConnectionLimits
from gpu_worker.protocol import ErrorCode

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.timeout(300)]

LIMITS = ConnectionLimits()  # the worker under test runs with the defaults
CANARY_BOUND_S = 60.0


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class Raw:
    """A bare session connection: frames in, frames out, no SDK in between."""

    def __init__(self, path: str, timeout: float = 30.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        deadline = time.monotonic() + 10
        while True:
            try:
                self.sock.connect(path)
                break
            except BlockingIOError:  # the listen backlog is full until the worker accepts more
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    def send(self, req_id: int, op: str, args: dict[str, Any] | None = None) -> None:
        self.sock.sendall(protocol.pack(protocol.request(req_id, op, args)))

    def recv(self) -> Any | None:
        """The next frame, or None once the worker closed the connection."""
        header = self._exact(protocol.HEADER_BYTES)
        if header is None:
            return None
        body = self._exact(protocol.frame_length(header))
        return None if body is None else protocol.unpack_body(body)

    def call(self, req_id: int, op: str, args: dict[str, Any] | None = None) -> Any:
        self.send(req_id, op, args)
        return self.recv()

    def hello(self, token: str) -> None:
        reply = self.call(0, "hello", {"token": token})
        assert reply is not None and "ok" in reply, reply

    def _exact(self, n: int) -> bytes | None:
        buf = bytearray()
        while len(buf) < n:
            try:
                chunk = self.sock.recv(n - len(buf))
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                return None
            buf.extend(chunk)
        return bytes(buf)

    def close(self) -> None:
        self.sock.close()


def canary(worker: Any, out: dict[str, Any], steps: int = 6) -> Callable[[], None]:
    """Another tenant generating a few tokens through the SDK; its time lands in ``out``."""

    def run() -> None:
        try:
            with worker.session(f"canary-{uuid.uuid4().hex[:6]}") as info:
                t0 = time.monotonic()
                s = sy.connect(info.socket_path, info.token)
                try:
                    out["tokens"] = s.generate(s.kv_create(), s.tokenize("the canary sings"), steps, stop=[])
                finally:
                    s.close()
                out["seconds"] = time.monotonic() - t0
        except BaseException as exc:
            out["error"] = exc

    return run


def assert_canary(out: dict[str, Any], steps: int = 6) -> None:
    assert "error" not in out, out["error"]
    assert len(out["tokens"]) == steps, out
    assert out["seconds"] < CANARY_BOUND_S, out


def test_unread_replies_stop_the_reader_not_the_worker(gpu_worker_process) -> None:
    """A client pipelining cheap calls with big replies and never reading them: the worker stops
    reading it once ~max_unsent_reply_bytes are unsent, so its memory stays flat (it grew by
    hundreds of MB before) and the attacker's own writes stall; another tenant is served."""
    worker = gpu_worker_process
    pid = worker.proc.pid
    growth_limit = 96 * 1024 * 1024
    with worker.session(f"flood-{uuid.uuid4().hex[:6]}", deadline_s=600) as info:
        raw = Raw(info.socket_path, timeout=3.0)
        raw.hello(info.token)
        kv = raw.call(1, "kv_create", {})["ok"]["kv"]
        toks = raw.call(2, "tokenize", {"text": "a flood of replies"})["ok"]
        (dist,) = raw.call(3, "pred", {"kv": kv, "tokens": toks})["ok"]["dists"]
        full = raw.call(4, "dist_full", {"dist": dist})["ok"]  # warms the path; ~100 kB a reply
        assert len(full) > 50_000
        batch = b"".join(
            protocol.pack(protocol.request(10 + i, op, {"dist": dist, "kv": kv}))
            for i, op in enumerate(["dist_full"] * 40 + ["vocab_info"] * 10 + ["kv_len"] * 10)
        )
        base = rss_bytes(pid)
        state: dict[str, Any] = {"peak": 0, "stop": False, "blocked": False, "batches": 0}

        def watch() -> None:
            while not state["stop"]:
                state["peak"] = max(state["peak"], rss_bytes(pid) - base)
                if state["peak"] > growth_limit:
                    state["stop"] = True  # self-stopping: the bound is already broken
                time.sleep(0.02)

        out: dict[str, Any] = {}
        watcher = threading.Thread(target=watch)
        bystander = threading.Thread(target=canary(worker, out))
        watcher.start()
        bystander.start()
        try:
            deadline = time.monotonic() + 30
            while not state["stop"] and state["batches"] < 400 and time.monotonic() < deadline:
                try:
                    raw.sock.sendall(batch)
                except TimeoutError:
                    state["blocked"] = True  # the worker stopped reading us
                    break
                state["batches"] += 1
                time.sleep(0.002)  # let the worker take each batch (and its in-flight cap) in turn
            time.sleep(1.0)  # replies of the calls already read are still being produced
        finally:
            bystander.join(timeout=120)
            state["stop"] = True
            watcher.join()
            raw.close()
        print(f"rss growth peak {state['peak'] / 2**20:.1f} MiB after {state['batches']} batches; canary {out}")
        assert state["peak"] <= growth_limit, f"worker grew by {state['peak'] / 2**20:.0f} MiB"
        assert state["blocked"], "the worker kept reading a client that reads no replies"
        assert_canary(out)
    worker.assert_alive()


def test_connections_without_hello_are_capped_and_closed(gpu_worker_process) -> None:
    """300 connections that never say hello: past max_connections_per_session each gets EBUSY
    and is closed at once, the rest get EAUTH after hello_timeout_s; the worker's open
    descriptors return to where they were, and the session and another tenant still work."""
    worker = gpu_worker_process
    pid = worker.proc.pid
    cap = LIMITS.max_connections_per_session
    with worker.session(f"conns-{uuid.uuid4().hex[:6]}", deadline_s=600) as info:
        base_fds = open_fds(pid)
        before = worker.admin.stats()["connections"]
        conns = []
        for _ in range(300):
            c = Raw(info.socket_path, timeout=LIMITS.hello_timeout_s + 10)
            conns.append(c)
        out: dict[str, Any] = {}
        bystander = threading.Thread(target=canary(worker, out))
        bystander.start()
        try:
            refused = [c.recv() for c in conns[cap:]]
            for frame in refused:
                assert frame is not None and frame["id"] is None, frame
                assert frame["err"]["code"] == ErrorCode.BUSY, frame
                assert "max_connections_per_session" in frame["err"]["message"], frame
            assert all(c.recv() is None for c in conns[cap:])  # closed after the frame
            t0 = time.monotonic()
            for c in conns[:cap]:
                frame = c.recv()
                assert frame is not None and frame["err"]["code"] == ErrorCode.NOT_AUTHENTICATED, frame
                assert "hello_timeout_s" in frame["err"]["message"], frame
                assert c.recv() is None
            waited = time.monotonic() - t0
            assert waited < LIMITS.hello_timeout_s + 3, waited
        finally:
            bystander.join(timeout=120)
            for c in conns:
                c.close()
        deadline = time.monotonic() + 10
        while open_fds(pid) > base_fds + 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert open_fds(pid) <= base_fds + 2, (open_fds(pid), base_fds)
        after = worker.admin.stats()["connections"]
        assert after["refused"] - before["refused"] == 300 - cap, (before, after)
        assert after["timed_out"] - before["timed_out"] == cap, (before, after)
        assert_canary(out)
        # The session itself is not harmed: a new connection says hello and works.
        s = sy.connect(info.socket_path, info.token)
        try:
            assert s.detokenize(s.tokenize("still here")) == "still here"
        finally:
            s.close()
    worker.assert_alive()


def test_partial_frames_are_bounded_and_timed_out(gpu_worker_process) -> None:
    """Authenticated connections each announcing an 8 MiB frame and sending 1 MiB of it: the
    session's partial-frame budget admits two, the third is refused with EBUSY at once, and the
    admitted ones are closed with ETIMEDOUT after frame_timeout_s; a big frame before hello is
    refused outright. The worker's memory stays flat and another tenant is served."""
    worker = gpu_worker_process
    pid = worker.proc.pid
    big = protocol.MAX_FRAME_BYTES
    admitted = LIMITS.max_partial_frame_bytes_per_session // big
    with worker.session(f"partial-{uuid.uuid4().hex[:6]}", deadline_s=600) as info:
        pre = Raw(info.socket_path)
        pre.sock.sendall(struct.pack(">I", big) + b"\x80" * 1024)
        frame = pre.recv()
        assert frame is not None and frame["err"]["code"] == ErrorCode.BAD_FRAME, frame
        assert "MAX_HELLO_FRAME_BYTES" in frame["err"]["message"], frame
        pre.close()

        base = rss_bytes(pid)
        conns = []
        for _ in range(admitted + 3):
            c = Raw(info.socket_path, timeout=LIMITS.frame_timeout_s + 15)
            c.hello(info.token)
            conns.append(c)
        out: dict[str, Any] = {}
        bystander = threading.Thread(target=canary(worker, out))
        t0 = time.monotonic()
        try:
            for i, c in enumerate(conns):
                c.sock.sendall(struct.pack(">I", big))
                try:
                    c.sock.sendall(b"\x00" * (1 << 20))
                except (BrokenPipeError, ConnectionResetError):
                    assert i >= admitted  # refused and closed while we sent
                time.sleep(0.05)
            bystander.start()
            for c in conns[admitted:]:
                frame = c.recv()
                assert frame is not None and frame["id"] is None, frame
                assert frame["err"]["code"] == ErrorCode.BUSY, frame
                assert "max_partial_frame_bytes_per_session" in frame["err"]["message"], frame
                assert time.monotonic() - t0 < LIMITS.frame_timeout_s / 2  # at once, not at the timeout
            growth = rss_bytes(pid) - base
            for c in conns[:admitted]:
                frame = c.recv()
                assert frame is not None and frame["err"]["code"] == ErrorCode.TIMEOUT, frame
                assert "frame_timeout_s" in frame["err"]["message"], frame
                assert c.recv() is None
            waited = time.monotonic() - t0
            assert LIMITS.frame_timeout_s - 1 < waited < LIMITS.frame_timeout_s + 5, waited
        finally:
            bystander.join(timeout=120)
            for c in conns:
                c.close()
        assert growth < 64 * 1024 * 1024, f"worker grew by {growth / 2**20:.0f} MiB"
        assert_canary(out)
    worker.assert_alive()


def test_a_header_that_stops_half_way_is_timed_out(gpu_worker_process) -> None:
    """Two bytes of a four-byte header and nothing more: the connection is closed with ETIMEDOUT
    after frame_timeout_s, as a frame whose body stops is (it would otherwise hold one of the
    session's connections until the run's deadline)."""
    worker = gpu_worker_process
    with worker.session(f"half-{uuid.uuid4().hex[:6]}", deadline_s=600) as info:
        c = Raw(info.socket_path, timeout=LIMITS.frame_timeout_s + 15)
        c.hello(info.token)
        t0 = time.monotonic()
        c.sock.sendall(b"\x00\x00")
        try:
            frame = c.recv()
            assert frame is not None and frame["err"]["code"] == ErrorCode.TIMEOUT, frame
            assert "frame_timeout_s" in frame["err"]["message"], frame
            assert c.recv() is None
            assert LIMITS.frame_timeout_s - 1 < time.monotonic() - t0 < LIMITS.frame_timeout_s + 5
        finally:
            c.close()
    worker.assert_alive()


def test_unattributable_error_fails_waiting_calls(gpu_worker_process) -> None:
    """An error reply without an id (a frame the worker could not read at all) fails every call
    waiting on that SDK connection at once instead of leaving them until the run's deadline."""
    with gpu_worker_process.session(f"noid-{uuid.uuid4().hex[:6]}", deadline_s=600) as info:
        s = sy.connect(info.socket_path, info.token)
        try:
            fut = s.conn.submit("sleep", {"seconds": 30})
            time.sleep(0.2)
            with s.conn._send_lock:  # a frame that is not even a map: no id to reply to
                s.conn._sock.sendall(struct.pack(">I", 1) + b"\xc1")
            t0 = time.monotonic()
            with pytest.raises(sy.BadFrame):
                fut.result(timeout=10)
            assert time.monotonic() - t0 < 5
        finally:
            s.close()


@pytest.mark.timeout(120)
def test_large_call_many_does_not_deadlock_under_back_pressure(gpu_worker_process) -> None:
    """The SDK writes one ``call_many`` before reading its replies: with the worker refusing to
    read past max_unsent_reply_bytes, the SDK must read while its write is blocked."""
    with gpu_worker_process.session(f"many-{uuid.uuid4().hex[:6]}", deadline_s=600) as info:
        s = sy.connect(info.socket_path, info.token)
        try:
            (dist,) = s.pred(s.kv_create(), s.tokenize("replies first"))
            text = "many words in a long text " * 8_000  # ~200 kB a request
            # ~1.5 MiB of quick replies, then ~8 MiB of requests still to write behind them.
            requests = [("dist_full", {"dist": dist.id})] * 16 + [("tokenize", {"text": text})] * 40
            t0 = time.monotonic()
            replies = s.conn.call_many(requests)
            assert len(replies) == 56 and all(r == replies[-1] for r in replies[16:])
            assert sum(len(r) for r in replies[:16]) > LIMITS.max_unsent_reply_bytes
            assert time.monotonic() - t0 < 60
        finally:
            s.close()


@pytest.mark.docker
def test_refused_frame_fails_its_call_at_once(lip_runner) -> None:
    """A LIP in the real sandbox sampling with a bias of MAX_MAP_ENTRIES + 1 entries gets
    BadFrame naming the limit at once (it does not wait for a reply until the run's deadline),
    and its connection keeps working. Sent with the low-level call: the SDK's ``sample``
    refuses such a map before sending (naming ``bias_set``), and this checks the worker."""
    n = protocol.MAX_MAP_ENTRIES + 1
    prog = f"""
    import time
    import symphony as sy

    def main(args):
        kv = sy.kv_create()
        (d,) = sy.pred(kv, sy.tokenize("a biased choice"))
        t0 = time.monotonic()
        try:
            bias = {{str(i): 0.5 for i in range({n})}}
            sy.session().conn.call("dist_sample", {{"dist": d.id, "temperature": 1.0, "bias": bias}})
        except sy.BadFrame as exc:
            caught = {{"type": type(exc).__name__, "op": exc.op, "message": exc.message}}
        else:
            caught = None
        seconds = time.monotonic() - t0
        return {{"caught": caught, "seconds": seconds, "after": d.argmax(bias={{1: 0.5}})}}
    """
    out: dict[str, Any] = {}
    bystander = threading.Thread(target=canary(lip_runner.worker, out))
    bystander.start()
    try:
        res = lip_runner.run(prog, deadline_s=30).result
    finally:
        bystander.join(timeout=120)
    assert res.status == "succeeded", (res.status, res.error, res.stderr[-2000:])
    caught = res.result["caught"]
    assert caught is not None and caught["type"] == "BadFrame" and caught["op"] == "dist_sample", caught
    assert f"{n} entries" in caught["message"] and "MAX_MAP_ENTRIES" in caught["message"], caught
    assert str(protocol.MAX_MAP_ENTRIES) in caught["message"], caught
    assert res.result["seconds"] < 5, res.result
    assert isinstance(res.result["after"], int)
    assert_canary(out)


def test_reply_over_a_decode_limit_is_refused_to_its_call(gpu_worker_process) -> None:
    """A reply the SDK could not decode (a token list over MAX_ARRAY_ITEMS) is refused by the
    worker as that call's InvalidArgument instead of ending the SDK's connection."""
    with gpu_worker_process.session(f"long-{uuid.uuid4().hex[:6]}", deadline_s=600) as info:
        s = sy.connect(info.socket_path, info.token)
        try:
            with pytest.raises(sy.InvalidArgument, match="MAX_ARRAY_ITEMS"):
                s.tokenize("many words in a long text " * 12_000)  # ~72k tokens
            assert s.detokenize(s.tokenize("still here")) == "still here"
        finally:
            s.close()


def test_partial_frames_are_bounded_worker_wide(gpu_worker_process) -> None:
    """Sessions that each stay within their own partial-frame budget but together announce more
    than max_partial_frame_bytes: the frame past the worker's budget is refused with EBUSY at
    once (announced lengths count, so nothing big needs to be sent); another tenant is served."""
    worker = gpu_worker_process
    big = protocol.MAX_FRAME_BYTES
    per_session = LIMITS.max_partial_frame_bytes_per_session // big
    fit = LIMITS.max_partial_frame_bytes // big
    sessions = -(-(fit + 1) // per_session)  # enough sessions to announce one frame too many
    infos = [worker.create_session(f"wide-{i}-{uuid.uuid4().hex[:6]}", deadline_s=600) for i in range(sessions)]
    conns: list[Raw] = []
    out: dict[str, Any] = {}
    try:
        for info in infos:
            for _ in range(per_session):
                if len(conns) == fit + 1:
                    break
                c = Raw(info.socket_path, timeout=LIMITS.frame_timeout_s + 15)
                c.hello(info.token)
                c.sock.sendall(struct.pack(">I", big) + b"\x00" * 1024)
                conns.append(c)
        canary(worker, out)()
        last = conns[-1]
        frame = last.recv()
        assert frame is not None and frame["id"] is None, frame
        assert frame["err"]["code"] == ErrorCode.BUSY, frame
        assert "max_partial_frame_bytes " in frame["err"]["message"], frame
        assert last.recv() is None
        for c in conns[:-1]:  # the admitted ones are still waiting for their bodies
            c.sock.setblocking(False)
            with pytest.raises(BlockingIOError):
                c.sock.recv(1)
    finally:
        for c in conns:
            c.close()
        for info in infos:
            worker.end_session(info.session_id)
    assert_canary(out)
    worker.assert_alive()


def test_connections_are_capped_worker_wide(tiny_model_dir) -> None:
    """Sessions that each stay under their own connection cap but together open more than
    max_connections (a worker of its own with a small cap, not thousands of sockets): the one
    past the cap gets EBUSY naming the limit and is closed; once some close, another tenant's
    session connects and generates again."""
    from tests.plugins.worker import start_worker

    cap, per_session = 24, 16
    flags = ["--max-connections", str(cap), "--max-connections-per-session", str(per_session)]
    with start_worker(tiny_model_dir, name=f"conncap-{uuid.uuid4().hex[:6]}", extra_args=flags) as worker:
        infos = [worker.create_session(f"cap-{i}-{uuid.uuid4().hex[:6]}", deadline_s=600) for i in range(2)]
        conns: list[Raw] = []
        try:
            for info in infos:
                for _ in range(per_session):
                    if len(conns) == cap:
                        break
                    c = Raw(info.socket_path)
                    c.hello(info.token)
                    conns.append(c)
            extra = Raw(infos[1].socket_path)
            frame = extra.recv()
            assert frame is not None and frame["id"] is None, frame
            assert frame["err"]["code"] == ErrorCode.BUSY, frame
            assert "max_connections)" in frame["err"]["message"], frame
            assert extra.recv() is None
            extra.close()
            for c in conns[:4]:
                c.close()
            out: dict[str, Any] = {}
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # the worker notices the closed ones within a moment
                out.clear()
                canary(worker, out)()
                if "error" not in out:
                    break
                time.sleep(0.2)
            assert_canary(out)
        finally:
            for c in conns:
                c.close()
        worker.assert_alive()
