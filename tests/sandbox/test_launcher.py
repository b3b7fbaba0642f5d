"""The launcher runs LIPs in gVisor against a real worker: results, failures, deadline, output
cap, zip programs, and no container left behind on any path."""

from __future__ import annotations

import io
import time
import zipfile
from pathlib import Path

import pytest

from sandbox.reaper import reap
from sandbox.spec import LABEL, LABEL_EXPIRES, SandboxSpec
from tests.conftest import container_names

pytestmark = [pytest.mark.integration, pytest.mark.docker, pytest.mark.vllm, pytest.mark.timeout(300)]


def container_exists(docker_client, name: str, within_s: float = 10.0) -> bool:
    """Whether the run's own container is still there ``within_s`` after the run (a run that
    ended at its record has its container removed in the background; other runs may be active
    concurrently)."""
    assert name.startswith("symphony-lip-")
    until = time.monotonic() + within_s
    while container_names(docker_client, name=name):
        if time.monotonic() > until:
            return True
        time.sleep(0.1)
    return False


def test_hello_world_returns_result_and_output(lip_runner, docker_client) -> None:
    run = lip_runner.run(
        """
        import symphony as sy

        def main(args):
            print("hello from", args["who"])
            ids = sy.tokenize("hello world")
            return {"who": args["who"], "n": len(ids), "text": sy.detokenize(ids)}
        """,
        {"who": "runsc"},
    )
    res = run.result
    assert res.status == "succeeded", res
    assert res.result == {"who": "runsc", "n": 2, "text": "hello world"}
    assert res.stdout == "hello from runsc\n"
    assert res.exit_code == 0 and res.error is None
    assert run.session_end.result == res.result  # the worker got the same result via finish
    assert not container_exists(docker_client, res.container)


def test_program_exception_fails_with_its_traceback(lip_runner) -> None:
    res = lip_runner.run(
        """
        def helper():
            raise ValueError("bad input")

        def main(args):
            helper()
        """
    ).result
    assert res.status == "failed" and res.exit_code == 1
    assert res.error.startswith("ValueError: bad input")
    assert "in helper" in res.error and "symphony" not in res.error


def test_setup_errors_are_clear(lip_runner) -> None:
    res = lip_runner.run("x = 1\n").result
    assert res.status == "failed" and res.exit_code == 2
    assert "main(args)" in res.error
    res = lip_runner.run("def main(args):\n    return object()\n").result
    assert res.status == "failed" and "not JSON" in res.error
    res = lip_runner.run("def main(args):\n    return {'score': float('nan')}\n").result
    assert res.status == "failed" and "not JSON" in res.error, res.error


def test_zip_program_with_main_module(lip_runner, tmp_path: Path) -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("main.py", "from helpers import double\n\ndef main(args):\n    return double(args['x'])\n")
        z.writestr("helpers.py", "def double(x):\n    return 2 * x\n")
    path = tmp_path / "prog.zip"
    path.write_bytes(buf.getvalue())
    res = lip_runner.run(path, {"x": 21}).result
    assert res.status == "succeeded", res
    assert res.result == 42


def test_async_main_is_awaited(lip_runner) -> None:
    res = lip_runner.run(
        """
        import asyncio
        from symphony import aio

        async def main(args):
            s = await aio.connect()
            toks = await asyncio.gather(*(s.tokenize(w) for w in ["a", "b b", "c c c"]))
            return [len(t) for t in toks]
        """
    ).result
    assert res.status == "succeeded", res
    assert res.result == [1, 2, 3]


def test_deadline_kills_and_reports_timed_out(lip_runner, docker_client) -> None:
    """The kill comes after the grace, and its message names the deadline the user set (not
    deadline + grace)."""
    t0 = time.monotonic()
    res = lip_runner.run("def main(args):\n    while True:\n        pass\n", deadline_s=3, grace_s=2).result
    assert res.status == "timed_out"
    assert "deadline of 3s exceeded" in res.error
    assert 5 <= time.monotonic() - t0 < 20
    assert not container_exists(docker_client, res.container)


def test_output_cap_kills_the_flood(lip_runner) -> None:
    res = lip_runner.run(
        """
        import os

        def main(args):
            chunk = b"x" * 65536
            while True:
                os.write(1, chunk)
        """,
        output_limit_bytes=10_000,
    ).result
    assert res.status == "killed"
    assert "output limit of 10000 bytes" in res.error
    assert len(res.stdout) == 10_000


def test_reaper_removes_expired_sandbox_containers(docker_client, sandbox_image: str) -> None:
    c = docker_client.containers.create(
        sandbox_image,
        ["python3", "-c", "pass"],
        runtime="runsc",
        network_mode="none",
        labels={LABEL: "1", LABEL_EXPIRES: str(int(time.time()) - 1)},
    )
    keep = docker_client.containers.create(
        sandbox_image,
        ["python3", "-c", "pass"],
        runtime="runsc",
        network_mode="none",
        labels={LABEL: "1", LABEL_EXPIRES: str(int(time.time()) + 3600)},
    )
    try:
        removed = reap(docker_client)
        assert c.name in removed and keep.name not in removed
    finally:
        keep.remove(force=True)


def test_missing_socket_is_an_error_not_a_run(launcher, tmp_path: Path) -> None:
    prog = tmp_path / "p.py"
    prog.write_text("def main(a):\n    return 1\n")
    with pytest.raises(FileNotFoundError):
        launcher.run(SandboxSpec(str(prog), {}, str(tmp_path / "nope.sock"), "t", "r", "ten"))


def test_an_image_removed_after_it_was_seen_is_a_clear_error(docker_client, sandbox_image: str) -> None:
    """The launcher asks dockerd about an image once; if the image goes away later, ``create``
    says so as clearly as the first check would have, and the next run asks again."""
    from sandbox.cold import SandboxLauncher
    from sandbox.spec import SandboxLimits, SandboxUnavailable

    tag = f"symphony-sandbox:removed-{time.monotonic_ns()}"
    docker_client.images.get(sandbox_image).tag(tag)
    launcher = SandboxLauncher(client=docker_client)
    limits = SandboxLimits(image=tag)
    assert launcher.image_for(limits) == tag
    docker_client.images.remove(tag)
    config = launcher.container_config(limits, tag, command=["true"], environment={}, mounts=[], labels={})
    with pytest.raises(SandboxUnavailable, match="is not built"):
        launcher.create(**config)
    with pytest.raises(SandboxUnavailable, match="is not built"):
        launcher.image_for(limits)


def test_containers_have_no_network_mode_and_no_network_config(docker_client, sandbox_image: str) -> None:
    """``network_mode=none`` keeps traffic out; ``NetworkDisabled`` also keeps dockerd from adding
    its libnetwork-setkey prestart hook (a re-exec of dockerd on every cold start)."""
    from sandbox.cold import SandboxLauncher
    from sandbox.spec import SandboxLimits

    launcher = SandboxLauncher(client=docker_client)
    config = launcher.container_config(
        SandboxLimits(), sandbox_image, command=["true"], environment={}, mounts=[], labels={}
    )
    container = launcher.create(**config)
    try:
        container.reload()
        assert container.attrs["HostConfig"]["NetworkMode"] == "none"
        assert container.attrs["Config"].get("NetworkDisabled") is True
    finally:
        container.remove(force=True)
