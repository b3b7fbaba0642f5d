"""The reaper: removes sandbox containers (and warm pool slot dirs) that nobody will remove, by
their labels (:mod:`sandbox.spec`): a launcher that died, a deadline long past, an exit nobody
collected; and the accounts' CPU groups left empty (:mod:`sandbox.cpu_groups`). Run periodically
(``python -m sandbox.reaper``) and at executor start-up.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import socket
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sandbox import cpu_groups
from sandbox.containers import docker_client
from sandbox.spec import LABEL, LABEL_EXPIRES, LABEL_OWNER, LABEL_SLOT_DIR, SLOT_DIR_PREFIX

log = logging.getLogger(__name__)

#: An exited sandbox nobody removed is reaped after this long (``SYMPHONY_SANDBOX_EXITED_GRACE_S``).
EXITED_GRACE_S = float(os.environ.get("SYMPHONY_SANDBOX_EXITED_GRACE_S") or 60)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_slot_dir(path: str) -> None:
    """Remove a dead pool slot's host dir (only a dir named like one: the label is our own,
    but a bad path must never turn into ``rm -rf`` of something else)."""
    if path and os.path.isabs(path) and Path(path).name.startswith(SLOT_DIR_PREFIX):
        shutil.rmtree(path, ignore_errors=True)


def _exited_long_ago(container: Any, now: float, grace_s: float) -> bool:
    """An exited sandbox whose launcher never removed it (dockerd restarted under a run, the
    removal failed) is garbage once it has been stopped for ``grace_s``: a live launcher reads
    its exit status within moments of the exit."""
    if container.status not in ("exited", "dead"):
        return False
    finished = (container.attrs.get("State") or {}).get("FinishedAt", "")
    try:
        stopped = datetime.strptime(finished[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return False
    return stopped > 0 and now - stopped > grace_s


def _sandbox_containers(client: Any) -> list[Any]:
    """Every Symphony sandbox container, each inspected (labels, ``State.FinishedAt``).

    Listed sparse and inspected one by one, skipping any removed in between: a launcher removes
    its container when a run ends, and a full listing inspects every container itself and fails
    whole on the first that vanished under it."""
    import docker.errors

    found = []
    for c in client.containers.list(all=True, sparse=True, filters={"label": LABEL}):
        try:
            c.reload()
        except docker.errors.NotFound:
            continue
        found.append(c)
    return found


def reap(client: Any = None, now: float | None = None, exited_grace_s: float = EXITED_GRACE_S) -> list[str]:
    """Remove sandbox containers whose launcher died, whose deadline (+ grace) passed, or that
    exited more than ``exited_grace_s`` ago without being removed.

    Warm-pool containers carry the same labels (their expiry covers the pool's idle age plus its
    longest deadline), so an orphaned pool is reaped like a crashed run, slot dirs included.

    Run periodically (``python -m sandbox.reaper``) and at worker/executor start-up.
    """
    client = client or docker_client()
    now = time.time() if now is None else now
    host = socket.gethostname()
    removed: list[str] = []
    for c in _sandbox_containers(client):
        labels = c.labels or {}
        owner_host, _, pid = labels.get(LABEL_OWNER, "").rpartition(":")
        try:
            expires = float(labels.get(LABEL_EXPIRES, "0"))
        except ValueError:
            expires = 0.0
        orphan = owner_host == host and pid.isdigit() and not _pid_alive(int(pid))
        if orphan or expires < now or _exited_long_ago(c, now, exited_grace_s):
            try:
                c.remove(force=True)
                removed.append(c.name)
            except Exception as exc:
                log.warning("event=reap_failed container=%s error=%s", c.name, exc)
                continue
            _remove_slot_dir(labels.get(LABEL_SLOT_DIR, ""))
    if removed:
        log.info("event=sandbox_reaped count=%d containers=%s", len(removed), ",".join(removed))
    pruned = cpu_groups.prune_idle()  # account groups docker left empty (sandbox/cpu_groups.py)
    if pruned:
        log.info("event=cpu_groups_pruned count=%d", len(pruned))
    return removed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sandbox.reaper", description="remove leftover sandboxes")
    parser.parse_args(argv)
    print(json.dumps({"removed": reap()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
