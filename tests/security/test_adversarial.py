"""Hostile LIPs (docs/ARCHITECTURE.md §7): each attempt is contained with a clear error on its own run,
while a well-behaved run of another tenant, running at the same time, completes correctly and
the worker stays healthy."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

import symphony as sy

pytestmark = [pytest.mark.integration, pytest.mark.docker, pytest.mark.vllm, pytest.mark.timeout(300)]

GOOD = """
import symphony as sy

def main(args):
    kv = sy.kv_create()
    return sy.generate(kv, sy.tokenize("A well behaved program"), max_tokens=8)
"""


@pytest.fixture(scope="module")
def good_tokens(gpu_worker_process) -> list[int]:
    with gpu_worker_process.session() as info:
        s = sy.connect(info.socket_path, info.token)
        try:
            return s.generate(s.kv_create(), s.tokenize("A well behaved program"), 8)
        finally:
            s.close()


@contextmanager
def bystander(lip_runner, good_tokens: list[int]) -> Iterator[None]:
    """Run the good program (another tenant) concurrently; assert it succeeded afterwards."""
    box: dict = {}

    def go() -> None:
        try:
            box["run"] = lip_runner.run(GOOD, tenant=f"good-{uuid.uuid4().hex[:6]}")
        except BaseException as exc:
            box["exc"] = exc

    t = threading.Thread(target=go)
    t.start()
    try:
        yield
    finally:
        t.join(timeout=120)
    assert "exc" not in box, box.get("exc")
    res = box["run"].result
    assert res.status == "succeeded", (res.error, res.stderr[-1000:])
    assert res.result == good_tokens


def test_no_outbound_network(lip_runner, good_tokens, gpu_worker_process) -> None:
    prog = """
    import socket

    def attempt(fn):
        try:
            fn()
            return "connected"
        except OSError as exc:
            return type(exc).__name__

    def main(args):
        return {
            "internet": attempt(lambda: socket.create_connection(("1.1.1.1", 80), timeout=3)),
            "host_redis": attempt(lambda: socket.create_connection(("127.0.0.1", 6379), timeout=3)),
            "dns": attempt(lambda: socket.getaddrinfo("example.com", 80)),
            "admin_socket": attempt(lambda: socket.socket(socket.AF_UNIX).connect(args["admin"])),
        }
    """
    with bystander(lip_runner, good_tokens):
        res = lip_runner.run(prog, {"admin": gpu_worker_process.admin_socket}).result
    assert res.status == "succeeded", res.error
    assert all(v != "connected" for v in res.result.values()), res.result


def test_host_files_are_out_of_reach(lip_runner, gpu_worker_process) -> None:
    prog = """
    import os

    def attempt(fn):
        try:
            return ["ok", fn()]
        except OSError as exc:
            return ["denied", type(exc).__name__]

    def main(args):
        return {
            "uid": os.getuid(),
            "repo": attempt(lambda: os.listdir("/work")),
            "sessions_dir": attempt(lambda: os.listdir(args["sessions"])),
            "shadow": attempt(lambda: open("/etc/shadow").read()),
            "write_root": attempt(lambda: open("/evil", "w").write("x")),
            "write_lip": attempt(lambda: open("/lip/program.py", "a").write("x")),
            "lip_dir": sorted(os.listdir("/lip")),
        }
    """
    res = lip_runner.run(prog, {"sessions": gpu_worker_process.sessions_dir}).result
    assert res.status == "succeeded", res.error
    out = res.result
    assert out["uid"] != 0
    for key in ("repo", "sessions_dir", "shadow", "write_root", "write_lip"):
        assert out[key][0] == "denied", (key, out[key])
    assert out["lip_dir"] == ["args.json", "program.py"]


def test_fork_bomb_is_contained(lip_runner, good_tokens, gpu_worker_process) -> None:
    prog = """
    import os, time

    def main(args):
        while True:
            try:
                if os.fork() == 0:
                    time.sleep(60)
                    os._exit(0)
            except OSError:
                pass
    """
    with bystander(lip_runner, good_tokens):
        res = lip_runner.run(prog, pids=32, deadline_s=20).result
    assert res.status in ("failed", "killed", "timed_out")
    assert res.error and ("process limit" in res.error or "deadline" in res.error), res.error
    gpu_worker_process.assert_alive()


def test_memory_bomb_is_killed(lip_runner, good_tokens, gpu_worker_process) -> None:
    prog = """
    def main(args):
        hog = []
        while True:
            hog.append(bytearray(32 << 20))
    """
    with bystander(lip_runner, good_tokens):
        res = lip_runner.run(prog, memory_mb=128).result
    assert res.status == "killed", (res.status, res.error)
    assert "memory limit of 128 MiB" in res.error
    gpu_worker_process.assert_alive()


def test_cpu_spin_past_deadline_times_out(lip_runner, good_tokens) -> None:
    with bystander(lip_runner, good_tokens):
        res = lip_runner.run("def main(args):\n    while True:\n        pass\n", deadline_s=4).result
    assert res.status == "timed_out"
    assert "deadline of 4s exceeded" in res.error


def test_gigabyte_output_flood_is_cut_off(lip_runner, good_tokens) -> None:
    prog = """
    import os

    def main(args):
        chunk = b"A" * (1 << 20)
        for _ in range(1024):
            os.write(1, chunk)
        return "flooded"
    """
    with bystander(lip_runner, good_tokens):
        res = lip_runner.run(prog, output_limit_bytes=1 << 20).result
    assert res.status == "killed"
    assert "output limit of 1048576 bytes exceeded" in res.error
    assert len(res.stdout) <= 1 << 20


def test_forged_handles_and_other_tenants_files(lip_runner, gpu_worker_process) -> None:
    """Handles of another tenant's live session and its named file are invisible to a LIP."""
    victim = f"victim-{uuid.uuid4().hex[:6]}"
    with gpu_worker_process.session(victim) as info:
        s = sy.connect(info.socket_path, info.token)
        secret = s.kv_create("secret")
        s.release(s.pred(secret, s.tokenize("the victim's private prompt")))
        live = s.kv_fork(secret)
        prog = """
        import random
        import symphony as sy

        def probe(fn):
            try:
                fn()
                return "ok"
            except sy.SymphonyError as exc:
                return type(exc).__name__

        def main(args):
            rng = random.Random(0)
            handles = args["handles"] + [rng.getrandbits(62) for _ in range(200)] + [0, 1, 2, -1]
            forged = {probe(lambda h=h: sy.kv_len(h)) for h in handles}
            forged |= {probe(lambda h=h: sy.kv_fork(h)) for h in args["handles"]}
            forged |= {probe(lambda h=h: sy.pred(h, [1, 2])) for h in args["handles"]}
            names = {
                "open": probe(lambda: sy.kv_open("secret")),
                "open_w": probe(lambda: sy.kv_open("secret", "w")),
                "remove": probe(lambda: sy.kv_remove("secret")),
                "pin": probe(lambda: sy.kv_pin("secret", False)),
                "traversal": probe(lambda: sy.kv_open("../" + args["victim"] + "/secret")),
                "absolute": probe(lambda: sy.kv_open("/" + args["victim"] + "/secret")),
            }
            return {"forged": sorted(forged), "names": names}
        """
        res = lip_runner.run(prog, {"handles": [secret.id, live.id], "victim": victim}).result
        assert res.status == "succeeded", res.error
        assert set(res.result["forged"]) <= {"KVNotFound", "InvalidArgument"}, res.result
        names = res.result["names"]
        assert {names[k] for k in ("open", "open_w", "remove", "pin")} == {"KVNotFound"}, names
        assert names["traversal"] in ("InvalidArgument", "KVNotFound")
        assert names["absolute"] in ("InvalidArgument", "KVNotFound")
        # The victim's handles and file are untouched.
        assert len(live) == len(secret) > 0
        secret.close()
        live.close()
        assert any(f["name"] == "secret" for f in gpu_worker_process.admin.kv_list(victim))
        s.kv_remove("secret")
        s.close()


def test_malformed_and_oversized_frames_close_only_that_connection(lip_runner, good_tokens) -> None:
    prog = """
    import os, socket, struct
    import symphony as sy

    PATH = os.environ["SYMPHONY_SOCKET"]

    def raw(payload, hello=True):
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(10)
        s.connect(PATH)
        if hello:
            sy.connect(PATH)  # a valid connection exists alongside
        s.sendall(payload)
        try:
            data = s.recv(65536)
        except OSError as exc:
            data = type(exc).__name__.encode()
        s.close()
        return len(data)

    def main(args):
        results = {
            "garbage_before_hello": raw(struct.pack(">I", 5) + b"\\xc1\\xc1\\xc1\\xc1\\xc1"),
            "huge_length": raw(struct.pack(">I", 0xFFFFFFF0) + b"x" * 100),
            "truncated": raw(struct.pack(">I", 100) + b"abc"),
            "not_a_map": raw(struct.pack(">I", 1) + b"\\x01"),
        }
        # The session still works on a fresh connection after all of that.
        s = sy.connect()
        results["still_works"] = s.detokenize(s.tokenize("still here"))
        try:
            s.conn.call("no_such_op", {})
        except sy.UnknownOp:
            results["unknown_op"] = "UnknownOp"
        try:
            s.conn.call("pred", {"kv": "x", "tokens": "y"})
        except sy.InvalidArgument:
            results["bad_args"] = "InvalidArgument"
        return results
    """
    with bystander(lip_runner, good_tokens):
        res = lip_runner.run(prog).result
    assert res.status == "succeeded", (res.error, res.stderr[-2000:])
    out = res.result
    assert out["still_works"] == "still here"
    assert out["unknown_op"] == "UnknownOp" and out["bad_args"] == "InvalidArgument"


def test_syscall_flood_is_bounded(lip_runner, good_tokens, gpu_worker_process) -> None:
    prog = """
    import threading
    import symphony as sy
    from symphony.admission import Admission

    def main(args):
        s = sy.session()
        # A hostile program skips the SDK's queue (admission.py) so the flood reaches the worker.
        s.conn.admission = Admission(100_000)
        counts = {"ok": 0, "busy": 0}
        lock = threading.Lock()

        def flood():
            futs = [s.conn.submit("vocab_info", {}) for _ in range(500)]
            for f in futs:
                try:
                    f.result(60)
                    key = "ok"
                except sy.Busy:
                    key = "busy"
                with lock:
                    counts[key] += 1

        threads = [threading.Thread(target=flood) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return counts
    """
    with bystander(lip_runner, good_tokens):
        res = lip_runner.run(prog).result
    assert res.status == "succeeded", res.error
    assert res.result["ok"] + res.result["busy"] == 4000
    assert res.result["ok"] > 0
    gpu_worker_process.assert_alive()
