"""Sandbox fixtures: dockerd with runsc, the sandbox image, and a helper that runs a LIP
through the launcher against a real worker session. Missing docker is a failure, not a skip."""

from __future__ import annotations

import tempfile
import textwrap
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


@dataclass
class LIPRun:
    """A finished run: the launcher's result and the worker's end-of-session record."""

    result: Any  # sandbox.spec.SandboxResult
    session_end: Any  # gpu_worker.admin_client.SessionEnd
    tenant: str


@pytest.fixture(scope="session")
def docker_client() -> Any:
    from sandbox import containers
    from sandbox.spec import SandboxUnavailable

    try:
        return containers.docker_client()
    except SandboxUnavailable as exc:
        pytest.fail(f"docker with the runsc runtime is required for this test: {exc}")


@pytest.fixture(scope="session")
def sandbox_image(docker_client: Any) -> str:
    """Build (or find) the image of the current SDK."""
    from sandbox.image import ensure

    try:
        return ensure(log=lambda m: None)
    except Exception as exc:
        pytest.fail(f"sandbox image could not be built: {exc!r}")


@pytest.fixture(scope="session")
def launcher(docker_client: Any, sandbox_image: str) -> Any:
    from sandbox.cold import SandboxLauncher

    return SandboxLauncher(client=docker_client, image=sandbox_image)


class LIPRunner:
    """``run(source_or_path, args, tenant=..., limits...)`` through sandbox + worker."""

    def __init__(self, worker: Any, launcher: Any) -> None:
        self.worker = worker
        self.launcher = launcher

    def run(
        self,
        program: str | Path,
        args: Any = None,
        *,
        tenant: str | None = None,
        session_limits: dict[str, Any] | None = None,
        run_id: str | None = None,
        tree: str | None = None,
        **spec_kw: Any,
    ) -> LIPRun:
        """``tree``: the run tree the session joins (its channels; default: a tree of its own)."""
        from sandbox.spec import SandboxSpec

        tenant = tenant or f"t-{uuid.uuid4().hex[:8]}"
        info = self.worker.create_session(tenant, run_id, tree=tree, **(session_limits or {}))
        with tempfile.TemporaryDirectory(prefix="lip-src-") as tmp:
            if isinstance(program, Path):
                path = program
            else:
                path = Path(tmp) / "program.py"
                path.write_text(textwrap.dedent(program))
            kw = {"deadline_s": 60.0, "memory_mb": 256, "cpus": 1.0, "pids": 64, "output_limit_bytes": 1 << 20}
            kw.update(spec_kw)
            try:
                res = self.launcher.run(
                    SandboxSpec(
                        program_path=str(path),
                        args=args if args is not None else {},
                        session_socket=info.socket_path,
                        session_token=info.token,
                        run_id=info.session_id,
                        tenant=tenant,
                        **kw,
                    )
                )
            finally:
                end = self.worker.end_session(info.session_id)
        return LIPRun(res, end, tenant)


@pytest.fixture(scope="session")
def lip_runner(gpu_worker_process: Any, launcher: Any) -> LIPRunner:
    return LIPRunner(gpu_worker_process, launcher)
