"""When a channel read can no longer get a message: every run that could send has ended.

A parent that spawned children and waits in ``recv`` (or a subscription's ``next``) for their
messages would otherwise sit until its deadline when they all fail. The runs that can send on a
tree's channels are its runs still alive; for a reader that spawned children those are its
children (their own children end with them, api/services/procs.py) and any other run of the tree
still on this worker (a parent's spawns run on its worker). So the read gives up with
ECHANCLOSED (reason ``senders_gone``) once

* the reader has spawned at least one child and none is on its way (a spawn not answered yet),
* every child it spawned has its ``end`` event on its stream (however it ended: the control
  plane writes one for every ending), and
* no other session of the tree is left in the worker's channel broker.

A reader that never spawned waits as before (its senders are its parent and siblings, and its
parent's ending ends the tree). A message sent before the last sender ended is still queued and
returned first; nothing queued is lost.
"""

from __future__ import annotations

import asyncio
import logging

from gpu_worker.ops import procs
from gpu_worker.ops.context import OpContext
from gpu_worker.protocol import ErrorCode, ErrorReason, ProtocolError
from gpu_worker.sessions import WorkerSession

log = logging.getLogger(__name__)

#: Seconds between tries when Redis cannot be read (the read keeps waiting meanwhile).
RETRY_S = 2.0
#: Children's outcomes named in the error, at most.
NAMED = 8


def watch(ctx: OpContext, s: WorkerSession, what: str) -> asyncio.Task[ProtocolError] | None:
    """A task that resolves with the error for a read of ``what`` once no run can send to it;
    None when the session spawned nothing (the read waits as before). The caller cancels it."""
    if not s.children and not s.spawning:
        return None
    return asyncio.get_running_loop().create_task(_senders_gone(ctx, s, what))


async def _senders_gone(ctx: OpContext, s: WorkerSession, what: str) -> ProtocolError:
    while True:
        watched = set(s.children)
        try:
            ended = await procs.await_all_ended(ctx.redis(), watched)
        except Exception as exc:  # redis raises many types: keep the read waiting, try again
            log.warning("event=senders_watch_failed session=%s error=%r", s.session_id, exc)
            await asyncio.sleep(RETRY_S)
            continue
        while ctx.channels.others_in_tree(s) and s.children == watched:
            await ctx.channels.member_left(s)
        if s.children == watched and not s.spawning:
            return _error(what, ended)
        if s.spawning:
            await asyncio.sleep(0.2)


def _error(what: str, ended: dict[str, tuple[str, str]]) -> ProtocolError:
    outcomes = []
    for child, (status, error) in sorted(ended.items())[:NAMED]:
        said = f" ({error.strip().splitlines()[0][:200]})" if error.strip() else ""  # "Type: message"
        outcomes.append(f"{child} {status}{said}")
    more = f" and {len(ended) - NAMED} more" if len(ended) > NAMED else ""
    return ProtocolError(
        ErrorCode.CHANNEL_CLOSED,
        f"no message can come on {what}: every run that could send has ended"
        f" (this run's children: {'; '.join(outcomes)}{more}); nothing is queued",
        reason=ErrorReason.SENDERS_GONE,
    )
