"""What one sandboxed run is: its spec, the fixed resource limits, its result, and the names the
cold path (:mod:`sandbox.cold`), the warm pool (:mod:`sandbox.pool`) and the reaper
(:mod:`sandbox.reaper`) agree on: container labels and the paths inside the sandbox.

No docker here: the control plane builds a :class:`SandboxSpec` and hands it to :func:`sandbox.run`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

LABEL = "symphony.sandbox"
LABEL_RUN = "symphony.run_id"
LABEL_TENANT = "symphony.tenant"
LABEL_OWNER = "symphony.launcher"  # "<hostname>:<pid>" of the launcher process
LABEL_EXPIRES = "symphony.expires"  # unix time after which the container is garbage
LABEL_POOL = "symphony.pool"  # "1" on warm-pool containers (sandbox/pool.py)
LABEL_SLOT_DIR = "symphony.slot_dir"  # host dir of a pool slot; the reaper removes it too
#: Prefix of a pool slot's host dir (the reaper only removes dirs whose name has it).
SLOT_DIR_PREFIX = "symphony-slot-"
#: Extra time past the deadline before the reaper treats a container as abandoned.
REAP_GRACE_S = 60.0

SOCKET_IN_SANDBOX = "/run/symphony/session.sock"
LIP_DIR = "/lip"
#: The sandbox's private tmpfs (inside the container, not the host's /tmp).
SANDBOX_TMP = "/tmp"  # noqa: S108


class SandboxUnavailable(RuntimeError):
    """dockerd, the runsc runtime or the sandbox image is missing (an infrastructure fault)."""


@dataclass(frozen=True)
class SandboxLimits:
    """The resource limits fixed at container creation (a warm container serves only equal ones)."""

    memory_mb: int = 512
    cpus: float = 1.0
    pids: int = 128
    tmpfs_mb: int = 64
    #: Image tag; default: the tag of the current SDK (``sandbox.image.image_tag()``).
    image: str | None = None


@dataclass(frozen=True)
class SandboxSpec:
    """One run: what to execute, how to reach its session, and its resource limits."""

    program_path: str
    args: Any
    session_socket: str
    session_token: str
    run_id: str
    tenant: str
    deadline_s: float = 60.0
    memory_mb: int = 512
    cpus: float = 1.0
    pids: int = 128
    output_limit_bytes: int = 1 << 20
    tmpfs_mb: int = 64
    #: Image tag; default: the tag of the current SDK (``sandbox.image.image_tag()``).
    image: str | None = None
    #: Extra seconds the container lives past ``deadline_s`` (so a LIP can report the worker's
    #: ETIMEDOUT itself); a kill at the end still reports ``deadline_s``, the limit the user set.
    grace_s: float = 0.0
    #: A spawned run's entry in its program's bundle, ``module:function`` (either part may be
    #: empty: the program itself, ``main``); "" for a run a client started.
    entry: str = ""
    #: The tenant's account (a person's tenants together): a cold container's CPU is weighed
    #: in the account's group (``sandbox.cpu_groups``); "" for none.
    account: str = ""

    @property
    def kill_after_s(self) -> float:
        return self.deadline_s + self.grace_s

    @property
    def limits(self) -> SandboxLimits:
        return SandboxLimits(self.memory_mb, self.cpus, self.pids, self.tmpfs_mb, self.image)


@dataclass
class SandboxResult:
    """Outcome of one run. ``status``: succeeded | failed | timed_out | killed."""

    status: str
    result: Any = None
    error: str | None = None
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    output_bytes: int = 0
    #: Seconds from ``run()`` until the container was started, and until it exited.
    start_s: float = 0.0
    duration_s: float = 0.0
    container: str = ""
    timings: dict[str, float] = field(default_factory=dict)
