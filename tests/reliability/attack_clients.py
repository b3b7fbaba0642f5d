"""The soaks' HTTP attack clients: what an attacker runs on its own machine, against the API.

In production these clients are not the service: they run on the attacker's hardware and cost
the service only the requests they send. On the 2-core test host they share the cores with the
stack, so run in the test process they would slow the canaries by taking CPU that no part of the
service hands out, and a soak would measure the harness competing with itself. The account soak
therefore runs them in a child process of their own at the lowest CPU priority (``nice 19``,
:func:`start_niced`); the requests reach the service as fast as the attacker's clients can send
them when the cores have room, and the service's isolation is what the canaries then measure.
The hostile soak still calls them in its own process (:func:`http_attacks`).

No Django here: the child imports this module alone (``python -m tests.reliability.attack_clients``),
reads its plan as JSON on stdin and writes what each attack got as JSON on stdout.

Self-stopping: every loop checks the plan's deadline, every request has a timeout, all traffic
goes to the base URL (127.0.0.1) given.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import requests

#: Where the hostile tenant's wrong keys come from (the canary uses 127.0.0.1).
ATTACKER_ADDRESS = "127.0.0.2"
#: Most stalled replay connections held open at once.
REPLAYS_HELD = 32
ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Attacker:
    """One tenant's API key, a program of it and a run of it whose events the floods read."""

    key_secret: str
    program: str
    run_id: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key_secret}"}


def http_attacks(base_url: str, attacker: Attacker, stop: float) -> dict[str, list[int]]:
    """Every HTTP attack at once until ``stop`` (``time.monotonic()``): many concurrent event
    streams of one run, simultaneous run creations past the plan's concurrency, a large streamed
    upload, wrong API keys under forged ``X-Forwarded-For``; the status codes each one got."""
    codes: dict[str, list[int]] = {"streams": [], "race": [], "upload": [], "forged": []}
    lock = threading.Lock()
    headers = attacker.headers

    def record(kind: str, code: int) -> None:
        with lock:
            codes[kind].append(code)

    def stream() -> None:
        try:
            # Held open for the whole attack: a stream with no event for a read timeout would
            # close, and on a loaded host this niced client then never held enough at once.
            read_s = max(10.0, stop - time.monotonic())
            with requests.get(
                f"{base_url}/api/v1/runs/{attacker.run_id}/events", headers=headers, stream=True, timeout=(10, read_s)
            ) as r:
                record("streams", r.status_code)
                # Read and drop big raw chunks: the attacker's own CPU must not be what slows the
                # canary when these run in the test's process.
                while time.monotonic() < stop and r.raw.read(1 << 20):
                    pass
        except requests.RequestException:
            return

    def race() -> None:
        body = {"program": attacker.program, "args": {"seconds": 1}, "limits": {"deadline_s": 120}}
        try:
            r = requests.post(f"{base_url}/api/v1/runs", headers=headers, json=body, timeout=30)
            record("race", r.status_code)
        except requests.RequestException:
            record("race", 0)

    def upload() -> None:
        def body() -> Iterator[bytes]:
            chunk = b"#" * (1 << 20)
            for _ in range(64):
                yield chunk

        try:
            r = requests.post(
                f"{base_url}/api/v1/programs?name=big",
                headers={**headers, "Content-Type": "application/octet-stream"},
                data=body(),
                timeout=30,
            )
            record("upload", r.status_code)
        except requests.ConnectionError:
            record("upload", 0)  # refused while streaming: the server closed the connection

    def forged() -> None:
        # From the attacker's own address: the wrong-key guard refuses every key of the address
        # it counts, so an attacker sharing the canary's address would lock the canary out too.
        bad = {"Authorization": "Bearer sk_bad_" + "x" * 40}
        transport = httpx.HTTPTransport(local_address=ATTACKER_ADDRESS)
        with httpx.Client(base_url=base_url, transport=transport, timeout=10) as client:
            for i in range(60):
                if time.monotonic() >= stop:
                    return
                forged_for = {"X-Forwarded-For": f"10.9.{i // 250}.{i % 250}"}
                record("forged", client.get("/api/v1/programs", headers={**bad, **forged_for}).status_code)

    with ThreadPoolExecutor(80) as pool:
        futures = [pool.submit(stream) for _ in range(50)]
        futures += [pool.submit(race) for _ in range(24)]
        futures += [pool.submit(upload), pool.submit(forged)]
        for f in futures:
            f.result()
    return codes


def stalled_replays(base_url: str, owners: list[tuple[str, str]], stop: float, stall_s: float) -> list[int]:
    """Replays of finished streams (``(key secret, run id)`` each) read for 4 KB and then never
    again, re-opened every ``stall_s`` as the server stops them, until ``stop``; the status
    code of each."""
    parts = urlsplit(base_url)
    codes: list[int] = []
    held: list[socket.socket] = []
    try:
        while time.monotonic() < stop:
            for key_secret, run_id in owners:
                for _ in range(4):
                    sock = socket.socket()
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                    sock.settimeout(10)
                    try:
                        sock.connect((parts.hostname, parts.port))
                        head = f"GET /api/v1/runs/{run_id}/events HTTP/1.1\r\nHost: {parts.netloc}\r\n"
                        sock.sendall(f"{head}Authorization: Bearer {key_secret}\r\n\r\n".encode())
                        first = sock.recv(4096)
                        codes.append(int(first.split(b" ", 2)[1]) if first.startswith(b"HTTP/1.1 ") else 0)
                    except OSError:
                        codes.append(0)
                    held.append(sock)
            time.sleep(stall_s)
            while len(held) > REPLAYS_HELD:
                held.pop(0).close()
    finally:
        for sock in held:
            sock.close()
    return codes


def start_niced(plan: dict) -> subprocess.Popen:
    """A child process at ``nice 19`` running ``plan`` (see :func:`main`); read its answer with
    :func:`result`."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.reliability.attack_clients"],
        cwd=str(ROOT),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(plan))
    proc.stdin.close()
    proc.stdin = None  # sent and closed: ``communicate`` must not flush it again
    return proc


def result(proc: subprocess.Popen, timeout: float) -> dict:
    """What the child of :func:`start_niced` reported (killed past ``timeout``)."""
    assert proc.stdout is not None
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    assert proc.returncode == 0, f"attack clients exited {proc.returncode}"
    return json.loads(out)


def main() -> None:
    """Plan on stdin: ``{"seconds", "base_url", "http": {key_secret, program, run_id},
    "replays": {"owners": [[key_secret, run_id], ...], "stall_s"}}``; answers
    ``{"http": codes, "replays": codes}`` on stdout."""
    os.nice(19)
    plan = json.load(sys.stdin)
    stop = time.monotonic() + float(plan["seconds"])
    base_url = plan["base_url"]
    out: dict = {}
    replays = plan["replays"]
    jobs = [
        threading.Thread(target=lambda: out.update(http=http_attacks(base_url, Attacker(**plan["http"]), stop))),
        threading.Thread(
            target=lambda: out.update(
                replays=stalled_replays(base_url, [tuple(o) for o in replays["owners"]], stop, replays["stall_s"])
            )
        ),
    ]
    for job in jobs:
        job.start()
    for job in jobs:
        job.join()
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
