"""dockerd with runsc as both run paths use it (docs/ARCHITECTURE.md §7): the image check, the
one container config with every isolation setting, create, attach (:class:`OutputWatch`), wait
and remove. The cold path (:mod:`sandbox.cold`) and the warm pool (:mod:`sandbox.pool`) build on
:class:`SandboxHost`, so their limits cannot drift apart.

Output is streamed through an attach socket into a capped :class:`~sandbox.output.OutputCollector`
(the container's log driver is ``none``, so a flood never reaches the disk); the output cap is
enforced by killing the container.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from typing import Any

from sandbox import cpu_groups
from sandbox import image as sandbox_image
from sandbox.output import OutputCollector
from sandbox.spec import LABEL, LABEL_OWNER, SANDBOX_TMP, SandboxLimits, SandboxUnavailable

log = logging.getLogger(__name__)

#: Host threads gVisor itself needs (sentry + gofer Go runtimes) on top of the program's own
#: processes/threads. The docker pids limit is a host cgroup limit, so ``spec.pids`` alone would
#: starve runsc: with a host limit of 32 ``runsc start`` hangs forever (measured).
RUNSC_HOST_PIDS = 64


def docker_client(timeout: int = 120):
    """A docker client of a dockerd that has the runsc runtime; :class:`SandboxUnavailable` if none."""
    import docker

    try:
        client = docker.from_env(timeout=timeout)
        info = client.info()
    except Exception as exc:
        raise SandboxUnavailable(f"dockerd is not reachable: {exc}") from exc
    if "runsc" not in (info.get("Runtimes") or {}):
        raise SandboxUnavailable("dockerd has no runsc runtime registered (scripts/bootstrap.sh services)")
    return client


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class SandboxHost:
    """Sandbox containers on this host's dockerd: image check, config, create, attach, wait,
    remove. Thread-safe; the cold path and the warm pool share one's settings."""

    def __init__(self, client: Any = None, image: str | None = None, runtime: str = "runsc") -> None:
        self.client = client or docker_client()
        self.image = image
        self.runtime = runtime
        #: Tags seen to exist: asked of dockerd once, not on every run (a round trip of a cold
        #: start's budget). An image removed since fails ``create``, which forgets the tag.
        self._images_seen: set[str] = set()

    def image_for(self, limits: SandboxLimits) -> str:
        """The image tag ``limits`` resolve to; raises :class:`SandboxUnavailable` if not built."""
        tag = limits.image or self.image or sandbox_image.image_tag()
        if tag not in self._images_seen:
            if not sandbox_image.image_exists(self.client, tag):
                raise SandboxUnavailable(f"sandbox image {tag} is not built; run `make sandbox-image`")
            self._images_seen.add(tag)
        return tag

    def create(self, **config: Any) -> Any:
        """``containers.create``; a missing image (removed since it was seen) is
        :class:`SandboxUnavailable`, as it is before the first run."""
        import docker.errors

        try:
            return self.client.containers.create(**config)
        except docker.errors.ImageNotFound:
            tag = config["image"]
            self._images_seen.discard(tag)
            raise SandboxUnavailable(f"sandbox image {tag} is not built; run `make sandbox-image`") from None

    def container_config(
        self,
        limits: SandboxLimits,
        tag: str,
        *,
        command: list[str],
        environment: dict[str, str],
        mounts: list[Any],
        labels: dict[str, str],
        name_prefix: str = "symphony-lip-",
        account: str = "",
    ) -> dict[str, Any]:
        """``containers.create`` kwargs with every isolation setting (docs/ARCHITECTURE.md §7).

        One place for the limits, so the cold path and the warm pool cannot drift apart. With
        ``account``, the container's CPU is weighed in that account's group
        (:mod:`sandbox.cpu_groups`).
        """
        from docker.types import LogConfig

        parent = cpu_groups.account_parent(account, cpu_groups.cgroup_driver(self.client)) if account else None
        return {
            **({"cgroup_parent": parent} if parent else {}),
            "image": tag,
            "command": command,
            "name": f"{name_prefix}{uuid.uuid4().hex[:12]}",
            "user": f"{sandbox_image.LIP_UID}:{sandbox_image.LIP_UID}",
            "runtime": self.runtime,
            "network_mode": "none",
            # Also no network *config*: without it dockerd adds its libnetwork-setkey prestart
            # hook (a re-exec of dockerd, ~70 ms of every cold start here) even for mode none.
            "network_disabled": True,
            "read_only": True,
            "tmpfs": {SANDBOX_TMP: f"rw,noexec,nosuid,nodev,size={int(limits.tmpfs_mb)}m,mode=1777"},
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
            "pids_limit": int(limits.pids) + RUNSC_HOST_PIDS,
            "mem_limit": f"{int(limits.memory_mb)}m",
            "memswap_limit": f"{int(limits.memory_mb)}m",
            "nano_cpus": int(float(limits.cpus) * 1e9),
            "working_dir": SANDBOX_TMP,
            "environment": {**environment, "HOME": SANDBOX_TMP},
            "mounts": mounts,
            "labels": {LABEL: "1", LABEL_OWNER: _owner(), **labels},
            "log_config": LogConfig(type="none"),
            "stdin_open": False,
            "tty": False,
            "detach": True,
        }

    def watch(self, container: Any, output_limit_bytes: int) -> OutputWatch:
        """Attach to ``container`` (before it starts) and pump its output into a capped collector."""
        return OutputWatch(self.client, container, output_limit_bytes)

    @staticmethod
    def wait_for_exit(container: Any, deadline: float, on_deadline) -> int | None:
        """Wait for exit; past ``deadline`` call ``on_deadline`` (kill) and wait for the exit."""
        import requests

        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                on_deadline()
                left = 30.0
                deadline = float("inf")
            try:
                out = container.wait(timeout=max(1, min(left, 3600)))
                return int(out.get("StatusCode", -1))
            except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
                if deadline == float("inf"):
                    return None
                continue

    @staticmethod
    def remove(container: Any) -> None:
        try:
            container.remove(force=True)
        except Exception as exc:
            log.warning("event=sandbox_remove_failed container=%s error=%s", getattr(container, "name", "?"), exc)


class OutputWatch:
    """A container's output stream pumped into a capped collector, and the one way to kill it.

    Attach before ``start`` (``logs=False`` never replays). Past the cap the pump keeps draining
    (the collector discards) and the container is killed from another thread: runsc cannot finish
    a kill while the program is blocked writing to an output pipe nobody reads.
    """

    def __init__(self, client: Any, container: Any, output_limit_bytes: int) -> None:
        self.container = container
        self.collector = OutputCollector(output_limit_bytes)
        #: The first kill reason ("deadline", "output"); later reasons are ignored.
        self.killed: dict[str, str] = {}
        self._kill_lock = threading.Lock()
        self._stream = client.api.attach(container.id, stdout=True, stderr=True, stream=True, logs=False, demux=True)
        self._reader = threading.Thread(target=self._pump, name=f"sandbox-output-{container.name}", daemon=True)
        self._reader.start()

    def kill(self, reason: str) -> None:
        with self._kill_lock:
            if self.killed:
                return
            self.killed[reason] = reason
        try:
            self.container.kill()
        except Exception as exc:  # already exited, or dockerd trouble (then remove() finishes it)
            log.warning("event=sandbox_kill_failed container=%s reason=%s error=%s", self.container.name, reason, exc)

    def _pump(self) -> None:
        try:
            for out, err in self._stream:
                if out:
                    self.collector.feed_stdout(out)
                if err:
                    self.collector.feed_stderr(err)
                if self.collector.exceeded and not self.killed:
                    threading.Thread(target=self.kill, args=("output",), daemon=True).start()
        except Exception as exc:
            log.debug("attach stream of %s ended: %s", self.container.name, exc)

    def close(self, join_s: float = 10.0) -> None:
        """Wait (bounded) for the stream to end, then close it."""
        if join_s > 0:
            self._reader.join(timeout=join_s)
        try:
            self._stream.close()
        except Exception:  # noqa: S110 - best effort; the container is removed next
            pass


def container_state(container: Any) -> dict[str, Any]:
    """``State`` of an exited container (``{}`` if dockerd cannot say)."""
    try:
        container.reload()
        return container.attrs.get("State", {}) or {}
    except Exception as exc:
        log.debug("inspect %s: %s", getattr(container, "name", "?"), exc)
        return {}
