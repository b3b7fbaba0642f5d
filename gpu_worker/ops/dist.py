"""Dist handles (logits rows a ``pred`` left worker-side), grammars with their matcher states and
bias vectors: choosing tokens from rows without shipping a vocabulary vector either way."""

from __future__ import annotations

from gpu_worker import bias_vectors, dists
from gpu_worker import protocol as p
from gpu_worker.grammar import Matcher
from gpu_worker.ops.context import OpContext
from gpu_worker.ops.pred import chooser
from gpu_worker.ops.registry import lip_op
from gpu_worker.sessions import WorkerSession


@lip_op(p.DistSample)
async def dist_sample(ctx: OpContext, s: WorkerSession, args: p.DistSample) -> int:
    return chooser(ctx, s, args)(s.dists.get(args.dist), 0)


@lip_op(p.DistArgmax)
async def dist_argmax(ctx: OpContext, s: WorkerSession, args: p.DistArgmax) -> int:
    return chooser(ctx, s, args)(s.dists.get(args.dist), 0)


@lip_op(p.DistTopk)
async def dist_topk(ctx: OpContext, s: WorkerSession, args: p.DistTopk) -> p.TopKReply:
    return dists.topk(s.dists.get(args.dist), args.k)


@lip_op(p.DistLogprob)
async def dist_logprob(ctx: OpContext, s: WorkerSession, args: p.DistLogprob) -> list[float]:
    return dists.logprob(s.dists.get(args.dist), args.token_ids)


@lip_op(p.DistFull)
async def dist_full(ctx: OpContext, s: WorkerSession, args: p.DistFull) -> bytes:
    return dists.full(s.dists.get(args.dist))


@lip_op(p.DistRelease)
async def dist_release(ctx: OpContext, s: WorkerSession, args: p.DistRelease) -> None:
    s.dists.release(args.dists)


@lip_op(p.Grammar)
async def grammar(ctx: OpContext, s: WorkerSession, args: p.Grammar) -> p.GrammarRef:
    compiled = await ctx.grammar.compile(args, s.account)
    return p.GrammarRef(grammar=s.grammars.add_grammar(compiled))


@lip_op(p.GrammarState)
async def grammar_state(ctx: OpContext, s: WorkerSession, args: p.GrammarState) -> p.MaskRef:
    compiled = s.grammars.grammar(args.grammar)
    return p.MaskRef(mask=s.grammars.add_matcher(Matcher(compiled, ctx.vocab_size)))


@lip_op(p.MaskAdvance)
async def mask_advance(ctx: OpContext, s: WorkerSession, args: p.MaskAdvance) -> p.Advanced:
    return p.Advanced(**s.grammars.matcher(args.mask).advance(args.token))


@lip_op(p.BiasCreate)
async def bias_create(ctx: OpContext, s: WorkerSession, args: p.BiasCreate) -> p.BiasRef:
    if args.ids is not None:
        assert args.value is not None  # BiasCreate._validate
        vector = bias_vectors.token_set_vector(ctx.vocab_size, args.ids, args.value)
    else:
        vector = bias_vectors.dense_vector(args.values)
    return p.BiasRef(bias=s.biases.add(vector))


@lip_op(p.BiasRelease)
async def bias_release(ctx: OpContext, s: WorkerSession, args: p.BiasRelease) -> None:
    s.biases.release(args.bias)
