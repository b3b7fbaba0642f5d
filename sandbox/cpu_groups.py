"""Sandbox CPU as a per-account pool: each account's containers share one parent cgroup.

Without it every sandbox container is a cgroup of its own beside all the others (``/docker/<id>``),
each with the same CPU weight, so an account running four containers got four times the CPU of
an account running one whenever the host's cores were contended: one person's tenants could
take the sandboxes' CPU from everyone by starting more runs. Here a cold container of a run is
created under ``/symphony-accounts/<account>`` (docker's ``--cgroup-parent``; runsc places its
sandbox and gofer there), whose weight is the kernel's default for a new group (``cpu.shares``
1024, cgroup v1): every account with a running container gets an equal weight however many
containers it runs, and its containers divide that weight among themselves. Idle accounts take
nothing (CFS weights are work-conserving). Each container keeps its own CPU limit as before
(``SandboxLimits.cpus``).

Only with dockerd's ``cgroupfs`` driver (the development and test host's): under the
``systemd`` driver a parent must be a slice, which this does not create, and containers are
left in docker's default parent. Warm-pool containers (``sandbox.pool``) are started before the
run, and so the account, is known: they stay in the default parent too.

Empty account groups are left by docker when their last container is removed; the reaper
removes those idle for :data:`IDLE_S` (:func:`prune_idle`).
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: The parent of every account's group, in each cgroup v1 hierarchy.
ROOT = "symphony-accounts"
#: Where the cgroup v1 hierarchies are mounted.
CGROUP_MOUNT = Path("/sys/fs/cgroup")
#: An account group with no container, unchanged for this long, is removed by the reaper (docker
#: creates it again for the account's next container).
IDLE_S = 60.0
_NAME = re.compile(r"[^A-Za-z0-9_.-]")

_drivers: dict[str, str] = {}
_drivers_lock = threading.Lock()


def cgroup_driver(client: Any) -> str:
    """dockerd's cgroup driver (``cgroupfs``, ``systemd``), asked once per daemon."""
    key = str(getattr(getattr(client, "api", None), "base_url", "") or id(client))
    with _drivers_lock:
        if key not in _drivers:
            try:
                _drivers[key] = str(client.info().get("CgroupDriver") or "")
            except Exception as exc:  # the create that follows reports dockerd's trouble itself
                log.warning("event=cgroup_driver_unknown error=%s", exc)
                return ""
        return _drivers[key]


def account_parent(account: str, driver: str) -> str | None:
    """The ``cgroup_parent`` of a container of ``account`` (``None``: docker's default)."""
    if not account or driver != "cgroupfs":
        return None
    return f"/{ROOT}/{_NAME.sub('_', account)[:100]}"


def prune_idle(mount: Path = CGROUP_MOUNT, idle_s: float = IDLE_S, now: float | None = None) -> list[str]:
    """Remove account groups with no container and no change for ``idle_s``, in every
    hierarchy; the paths removed. A group docker is creating a container in is never empty
    and unchanged that long."""
    now = time.time() if now is None else now
    removed = []
    for root in sorted(mount.glob(f"*/{ROOT}")):
        for group in sorted(p for p in root.iterdir() if p.is_dir()):
            try:
                if any(p.is_dir() for p in group.iterdir()) or now - group.stat().st_mtime < idle_s:
                    continue
                os.rmdir(group)  # refused (EBUSY) if a task or child appeared meanwhile
                removed.append(str(group))
            except OSError as exc:
                log.debug("cgroup %s kept: %s", group, exc)
    return removed
