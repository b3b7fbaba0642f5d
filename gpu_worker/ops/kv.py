"""KV file ops: each runs KVFS off the loop, scoped to the session (``Owner(tenant, session)``)
or, for named files, to its tenant; a name ``run/<name>`` is the run tree's own file
(``gpu_worker/run_files.py``)."""

from __future__ import annotations

from gpu_worker import protocol as p
from gpu_worker import run_files, tracing
from gpu_worker.kvfs.tiers import TierMove
from gpu_worker.ops.context import OpContext
from gpu_worker.ops.registry import lip_op
from gpu_worker.sessions import WorkerSession


@lip_op(p.KvCreate)
async def kv_create(ctx: OpContext, s: WorkerSession, args: p.KvCreate) -> p.KvRef:
    name = None if args.name is None else run_files.stored_name(s.tree, args.name)
    return p.KvRef(kv=await ctx.kv(ctx.kvfs.create, s.owner, name, args.cache, args.durable))


@lip_op(p.KvOpen)
async def kv_open(ctx: OpContext, s: WorkerSession, args: p.KvOpen) -> p.KvRef:
    # What the open brought back to the device (from the host tier or the store) is a KV move
    # of the run's trace: a slow open is then told apart from a slow lookup.
    moves: list[TierMove] | None = [] if s.trace.enabled else None
    handle = await ctx.kv(ctx.kvfs.open, s.owner, run_files.stored_name(s.tree, args.name), args.mode, moves)
    for move in moves or ():
        s.trace.add(
            tracing.KV_MOVE, f"{move.src}->{move.dst}", move.start, move.end, bytes=move.nbytes, file=args.name[:64]
        )
    s.usage.cached_tokens += await ctx.kv(ctx.kvfs.length, s.owner, handle)
    return p.KvRef(kv=handle)


@lip_op(p.KvFork)
async def kv_fork(ctx: OpContext, s: WorkerSession, args: p.KvFork) -> p.KvRef:
    return p.KvRef(kv=await ctx.kv(ctx.kvfs.fork, s.owner, args.kv))


@lip_op(p.KvClose)
async def kv_close(ctx: OpContext, s: WorkerSession, args: p.KvClose) -> None:
    await ctx.kv(ctx.kvfs.close, s.owner, args.kv)


@lip_op(p.KvRemove)
async def kv_remove(ctx: OpContext, s: WorkerSession, args: p.KvRemove) -> None:
    await ctx.kv(ctx.kvfs.remove, s.tenant, run_files.stored_name(s.tree, args.name))


@lip_op(p.KvLen)
async def kv_len(ctx: OpContext, s: WorkerSession, args: p.KvLen) -> int:
    return await ctx.kv(ctx.kvfs.length, s.owner, args.kv)


@lip_op(p.KvTokens)
async def kv_tokens(ctx: OpContext, s: WorkerSession, args: p.KvTokens) -> list[int]:
    return await ctx.kv(ctx.kvfs.tokens, s.owner, args.kv)


@lip_op(p.KvTruncate)
async def kv_truncate(ctx: OpContext, s: WorkerSession, args: p.KvTruncate) -> None:
    await ctx.kv(ctx.kvfs.truncate, s.owner, args.kv, args.n)


@lip_op(p.KvExtract)
async def kv_extract(ctx: OpContext, s: WorkerSession, args: p.KvExtract) -> p.KvRef:
    return p.KvRef(kv=await ctx.kv(ctx.kvfs.extract, s.owner, args.kv, args.start, args.end))


@lip_op(p.KvMerge)
async def kv_merge(ctx: OpContext, s: WorkerSession, args: p.KvMerge) -> p.KvRef:
    return p.KvRef(kv=await ctx.kv(ctx.kvfs.merge, s.owner, args.a, args.b))


@lip_op(p.KvPin)
async def kv_pin(ctx: OpContext, s: WorkerSession, args: p.KvPin) -> None:
    await ctx.kv(ctx.kvfs.pin, s.tenant, run_files.stored_name(s.tree, args.name), args.pinned)
