"""The warm pool runs LIPs in pre-started gVisor containers against a real worker: same results
as the cold path, much faster start, deadline from hand-off, one container per run, nothing of
one run (files, token) visible to the next or to another slot, nothing left after close."""

from __future__ import annotations

import socket
import statistics
import subprocess
import tempfile
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox.pool import SandboxPool
from sandbox.reaper import reap
from sandbox.spec import LABEL, LABEL_OWNER, LABEL_POOL, LABEL_SLOT_DIR, SandboxLimits, SandboxSpec
from tests.conftest import container_names

pytestmark = [pytest.mark.integration, pytest.mark.docker, pytest.mark.vllm, pytest.mark.timeout(300)]

#: The limits the pool's containers are created with (specs built by ``_spec`` match them).
LIMITS = {"memory_mb": 256, "cpus": 1.0, "pids": 64, "tmpfs_mb": 64}


@pytest.fixture(scope="module")
def pool(launcher: Any, sandbox_image: str) -> Iterator[SandboxPool]:
    with SandboxPool(launcher, size=2, template=SandboxLimits(image=sandbox_image, **LIMITS)) as p:
        assert p.wait_ready(timeout=120), "the pool never became ready"
        yield p


def _spec(info: Any, program: Path, args: Any = None, **kw: Any) -> SandboxSpec:
    return SandboxSpec(
        program_path=str(program),
        args=args if args is not None else {},
        session_socket=info.socket_path,
        session_token=info.token,
        run_id=info.session_id,
        tenant="t",
        **{"deadline_s": 60.0, **LIMITS, **kw},
    )


def run_lip(worker: Any, runner: Any, source: str, args: Any = None, **kw: Any) -> tuple[Any, Any, Any]:
    """Run ``source`` with ``runner`` (a pool's ``run`` or a launcher's); (result, session end, info)."""
    info = worker.create_session(f"t-{uuid.uuid4().hex[:8]}")
    with tempfile.TemporaryDirectory(prefix="lip-src-") as tmp:
        path = Path(tmp) / "program.py"
        path.write_text(textwrap.dedent(source))
        try:
            res = runner(_spec(info, path, args, **kw))
        finally:
            end = worker.end_session(info.session_id)
    return res, end, info


def pool_containers(docker_client: Any) -> set[str]:
    return set(container_names(docker_client, label=f"{LABEL_POOL}=1"))


def test_warm_run_returns_result_output_and_timings(gpu_worker_process, pool) -> None:
    res, end, _ = run_lip(
        gpu_worker_process,
        pool.run,
        """
        import symphony as sy

        def main(args):
            print("hello from", args["who"])
            ids = sy.tokenize("hello world")
            return {"who": args["who"], "n": len(ids), "text": sy.detokenize(ids)}
        """,
        {"who": "warm"},
    )
    assert res is not None, "the pool did not take a compatible run"
    assert res.status == "succeeded", res
    assert res.result == {"who": "warm", "n": 2, "text": "hello world"}
    assert res.stdout == "hello from warm\n"
    assert res.exit_code == 0 and res.error is None
    assert end.result == res.result  # the worker got the same result via finish
    assert res.timings["warm"] == 1.0 and 0 < res.timings["first_syscall_s"] < res.duration_s


def test_program_failure_is_reported_like_the_cold_path(gpu_worker_process, pool) -> None:
    pool.wait_ready(1)
    res, _, _ = run_lip(gpu_worker_process, pool.run, "def main(args):\n    raise ValueError('bad input')\n")
    assert res.status == "failed" and res.exit_code == 1
    assert res.error.startswith("ValueError: bad input")


def test_warm_start_is_far_faster_than_cold(gpu_worker_process, pool, launcher) -> None:
    empty = "def main(args):\n    return None\n"
    cold, warm = [], []
    for _ in range(3):
        t0 = time.monotonic()
        res, _, _ = run_lip(gpu_worker_process, launcher.run, empty)
        cold.append(time.monotonic() - t0)
        assert res.status == "succeeded", res
        assert pool.wait_ready(1, timeout=60)
        t0 = time.monotonic()
        res, _, _ = run_lip(gpu_worker_process, pool.run, empty)
        warm.append(time.monotonic() - t0)
        assert res is not None and res.status == "succeeded", res
    assert statistics.median(warm) < statistics.median(cold) / 3, (warm, cold)


def test_deadline_counts_from_handoff_and_times_out(gpu_worker_process, pool, docker_client) -> None:
    pool.wait_ready(1)
    t0 = time.monotonic()
    res, _, _ = run_lip(gpu_worker_process, pool.run, "def main(args):\n    while True:\n        pass\n", deadline_s=2)
    assert res.status == "timed_out", res
    assert "deadline of 2s" in res.error
    assert 2 <= time.monotonic() - t0 < 20


def test_consecutive_runs_share_no_container_files_or_token(gpu_worker_process, pool) -> None:
    prog = """
    import os

    def main(args):
        seen = {
            "marker": os.path.exists("/tmp/marker"),
            "lip": sorted(os.listdir("/lip")),
            "token": os.environ.get("SYMPHONY_TOKEN"),
            "environ": open("/proc/self/environ", "rb").read().decode(errors="replace"),
        }
        with open("/tmp/marker", "w") as fh:
            fh.write(args["n"])
        return seen
    """
    runs = []
    for n in ("1", "2"):
        assert pool.wait_ready(1, timeout=60)
        res, _, info = run_lip(gpu_worker_process, pool.run, prog, {"n": n})
        assert res is not None and res.status == "succeeded", res
        runs.append((res, info))
    (first, first_info), (second, second_info) = runs
    assert first.container != second.container
    assert second.result["marker"] is False  # the first run's tmpfs is gone with its container
    assert second.result["lip"] == ["args.json", "program.py"]
    assert second.result["token"] == second_info.token != first_info.token
    assert first_info.token not in second.result["environ"]  # the job never went through the env of exec


def test_lip_cannot_see_other_slots_or_the_pool_dir(gpu_worker_process, pool) -> None:
    assert pool.wait_ready(2, timeout=60)
    other = pool._ready[-1].dir  # the slot that will still be idle while this run executes
    res, _, _ = run_lip(
        gpu_worker_process,
        pool.run,
        """
        import os

        def attempt(fn):
            try:
                return repr(fn())
            except OSError as exc:
                return type(exc).__name__

        def main(args):
            return {
                "other_slot": attempt(lambda: os.listdir(args["other"])),
                "pool_root": attempt(lambda: os.listdir(args["root"])),
                "list_run_dir": attempt(lambda: os.listdir("/run/symphony")),
                "control": os.path.exists("/run/symphony/control.sock"),
                "write_run": attempt(lambda: open("/run/symphony/x", "w")),
                "write_lip": attempt(lambda: open("/lip/x", "w")),
            }
        """,
        {"other": str(other), "root": str(pool.root)},
    )
    assert res.status == "succeeded", res
    assert res.result["other_slot"] == "FileNotFoundError"
    assert res.result["pool_root"] == "FileNotFoundError"
    assert res.result["list_run_dir"] == "PermissionError"  # 0711: names only, and only its own
    assert res.result["control"] is False  # the control socket is unlinked once the runner connected
    assert res.result["write_run"] in ("PermissionError", "OSError")
    assert res.result["write_lip"] in ("PermissionError", "OSError")


def test_incompatible_or_unlinkable_specs_go_cold(gpu_worker_process, pool, tmp_path: Path) -> None:
    prog = tmp_path / "p.py"
    prog.write_text("def main(a):\n    return 1\n")
    with gpu_worker_process.session() as info:
        assert pool.run(_spec(info, prog, memory_mb=512)) is None
        assert pool.run(_spec(info, prog, deadline_s=pool.max_deadline_s + 1)) is None
    # A session socket on another filesystem cannot be hard-linked: the slot goes back unused.
    assert pool.wait_ready(2, timeout=60)
    names = {s.name for s in pool._ready}
    shm = Path("/dev/shm") / f"sym-{uuid.uuid4().hex[:8]}.sock"
    with socket.socket(socket.AF_UNIX) as srv:
        srv.bind(str(shm))
        try:
            with gpu_worker_process.session() as info:
                spec = _spec(info, prog)
                spec = SandboxSpec(**{**spec.__dict__, "session_socket": str(shm)})
                assert pool.run(spec) is None
        finally:
            shm.unlink()
    assert {s.name for s in pool._ready} == names


def test_close_leaves_no_containers_or_dirs(launcher, sandbox_image: str, docker_client) -> None:
    with tempfile.TemporaryDirectory(prefix="symp-", dir="/tmp") as root:  # short: AF_UNIX paths
        p = SandboxPool(launcher, size=2, template=SandboxLimits(image=sandbox_image, **LIMITS), root=root)
        p.start()
        assert p.wait_ready(timeout=120)
        names = {s.name for s in p._ready}
        assert names <= pool_containers(docker_client)
        p.close()
        assert not names & pool_containers(docker_client)
        assert list(p.root.iterdir()) == []


def test_too_long_root_is_refused_up_front(launcher, sandbox_image: str) -> None:
    p = SandboxPool(launcher, size=1, template=SandboxLimits(image=sandbox_image, **LIMITS), root="/tmp/" + "x" * 100)
    with pytest.raises(ValueError, match="AF_UNIX"):
        p.start()


def test_reaper_removes_orphaned_pool_containers(launcher, sandbox_image: str, docker_client, tmp_path: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    slot_dir = tmp_path / "symphony-slot-orphan"
    slot_dir.mkdir()
    config = launcher.container_config(
        SandboxLimits(image=sandbox_image, **LIMITS),
        sandbox_image,
        command=["python3", "-c", "pass"],
        environment={},
        mounts=[],
        labels={
            LABEL_POOL: "1",
            LABEL_SLOT_DIR: str(slot_dir),
            LABEL_OWNER: f"{socket.gethostname()}:{dead.pid}",
            "symphony.expires": str(int(time.time()) + 3600),
        },
    )
    c = docker_client.containers.create(**config)
    try:
        assert c.labels[LABEL] == "1"
        removed = reap(docker_client)
        assert c.name in removed
        assert not slot_dir.exists()
    finally:
        if container_names(docker_client, name=c.name):
            c.remove(force=True)
