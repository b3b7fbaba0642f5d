"""Run-scoped named KV files: ``run/<name>``, shared by a run tree and removed when it ends.

A named KV file (``kv_create("ctx")``) outlives every run: it is the tenant's until removed,
stored and billed meanwhile. Runs that only share a context for their own lifetime (a coordinator
and the children it spawned) need a file that cannot outlive them, whatever way they end: a
``finally: kv_remove(...)`` does not run when the run is cancelled or killed at its deadline, and
nothing runs when the worker is lost.

A name ``run/<name>`` names such a file. Every run of the tree (the root run and the runs spawned
under it: ``WorkerSession.tree``) that says ``run/<name>`` gets the same file, and no other tree
can name it. The worker stores it as the tenant's named file ``runtree-<tree>--<name>`` (names a
program may not use itself, :func:`check_plain`), so KVFS, the store, leases, pinning and the
tenant's file quota treat it as any named file, and it is removed:

* when the tree's last session on this worker ends (``Worker.end_session``): a tree's runs all run
  on its root's worker, and its root's session lives until the root ends, whatever the ending
  (finished, failed, cancelled, past its deadline);
* when the worker starts, and on every sweep of the worker's tick (:func:`sweep`), for any such
  file whose root run has ended or is unknown (its ``end`` event on the run's stream in Redis, or
  no stream): a lost worker's files, found in a store it shared, or at its own restart.

The control plane never bills one as stored KV past its tree (``api/services/billing.py``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from gpu_worker import contracts
from gpu_worker.protocol import ErrorCode, ProtocolError

if TYPE_CHECKING:  # the control plane reads the names here without loading KVFS (torch): its
    # imports are in the functions only the worker calls
    from gpu_worker.kvfs import KVFS

log = logging.getLogger(__name__)

#: What a program writes before a run-scoped file's name.
RUN_PREFIX = "run/"
#: How the worker's stored name of a run-scoped file starts (followed by the tree and ``--``).
STORED_PREFIX = "runtree-"
_SEPARATOR = "--"


def stored_name(tree: str, name: str) -> str:
    """The name KVFS holds for ``name`` as a program of ``tree`` wrote it: ``run/<x>`` becomes
    the tree's own file; any other name is the tenant's, as given (checked by
    :func:`check_plain`)."""
    if not name.startswith(RUN_PREFIX):
        return check_plain(name)
    from gpu_worker.kvfs.files import NAME_MAX

    local = name[len(RUN_PREFIX) :]
    stored = f"{STORED_PREFIX}{tree}{_SEPARATOR}{local}"
    room = NAME_MAX - len(stored) + len(local)
    if not local or len(stored) > NAME_MAX or "/" in local:
        raise ProtocolError(
            ErrorCode.BAD_ARGS,
            f"run-scoped KV file name {name[:140]!r} is not valid: 'run/' then 1-{room} letters,"
            " digits, '.', '_' or '-' (starting with a letter or digit)",
        )
    return stored


def check_plain(name: str) -> str:
    """A tenant file's name; the stored names of run-scoped files are refused (a program reaches
    its tree's files as ``run/<name>`` only)."""
    if name.startswith(STORED_PREFIX):
        raise ProtocolError(
            ErrorCode.BAD_ARGS,
            f"KV file names starting with {STORED_PREFIX!r} are reserved for run-scoped files;"
            f" a run names its tree's files {RUN_PREFIX}<name>",
        )
    return name


def tree_of(stored: str) -> str | None:
    """The tree a stored name belongs to; None for a tenant's own file."""
    if not stored.startswith(STORED_PREFIX) or _SEPARATOR not in stored[len(STORED_PREFIX) :]:
        return None
    return stored[len(STORED_PREFIX) :].split(_SEPARATOR, 1)[0]


def remove_tree(kvfs: KVFS, tenant: str, tree: str) -> list[str]:
    """Remove every run-scoped file of ``tree`` (blocking: call it off the loop); the names
    removed. Open handles keep their pages as anonymous files until closed."""
    from gpu_worker.kvfs import KVFSError

    prefix = f"{STORED_PREFIX}{tree}{_SEPARATOR}"
    removed = []
    for info in kvfs.list_files(tenant):
        if info.name.startswith(prefix):
            try:
                kvfs.remove(tenant, info.name)
                removed.append(info.name)
            except KVFSError as exc:  # removed meanwhile, or the store is down: the sweep retries
                log.warning("event=run_file_remove_failed tenant=%s name=%s error=%s", tenant, info.name, exc)
    if removed:
        log.info("event=run_files_removed tenant=%s tree=%s files=%d", tenant, tree, len(removed))
    return removed


def trees_on_file(kvfs: KVFS) -> dict[tuple[str, str], list[str]]:
    """``{(tenant, tree): [stored names]}`` of every run-scoped file this worker lists."""
    found: dict[tuple[str, str], list[str]] = {}
    for info in kvfs.list_files():
        tree = tree_of(info.name)
        if tree is not None:
            found.setdefault((info.tenant, tree), []).append(info.name)
    return found


async def sweep(kvfs_call: Any, kvfs: KVFS, redis: Any, live_trees: set[tuple[str, str]]) -> int:
    """Remove the run-scoped files of every tree that has no session here (``live_trees``:
    ``(tenant, tree)`` of this worker's sessions) and whose root run has ended: its stream has
    an ``end`` event, or has none at all (expired, or never a run of this control plane).
    ``kvfs_call(fn, *args)`` runs a KVFS call off the loop. Returns how many files it removed."""
    removed = 0
    for (tenant, tree), _names in (await kvfs_call(trees_on_file, kvfs)).items():
        if (tenant, tree) in live_trees or not await _ended(redis, tree):
            continue
        removed += len(await kvfs_call(remove_tree, kvfs, tenant, tree))
    return removed


async def _ended(redis: Any, tree: str) -> bool:
    key = contracts.run_stream_key(tree)
    last = await redis.xrevrange(key, count=1)
    if not last:
        return True
    return contracts.entry_strings(last[0][1])[0] == contracts.END
