"""Tokenizer ops: the served model's vocabulary, tokenize, detokenize and chat templates."""

from __future__ import annotations

from gpu_worker import protocol as p
from gpu_worker.ops.context import OpContext
from gpu_worker.ops.registry import lip_op
from gpu_worker.protocol import MAX_ARRAY_ITEMS, ErrorCode, ProtocolError
from gpu_worker.sessions import WorkerSession


def bad(message: str) -> ProtocolError:
    return ProtocolError(ErrorCode.BAD_ARGS, message)


@lip_op(p.VocabInfo)
async def vocab_info(ctx: OpContext, s: WorkerSession, args: p.VocabInfo) -> p.VocabInfoReply:
    tok = ctx.tokenizer
    return p.VocabInfoReply(
        vocab_size=ctx.vocab_size,
        eos_token_ids=tok.eos_token_ids,
        bos_token_id=tok.bos_token_id,
        chat_template=tok.chat_template,
    )


@lip_op(p.Tokenize)
async def tokenize(ctx: OpContext, s: WorkerSession, args: p.Tokenize) -> list[int]:
    return _decodable(await ctx.in_thread(ctx.tokenizer.encode, args.text, args.add_special_tokens))


def _decodable(ids: list[int]) -> list[int]:
    """A token list the SDK can decode: its replies have the same decode limits as requests."""
    if len(ids) > MAX_ARRAY_ITEMS:
        raise bad(f"the text is {len(ids)} tokens; a reply holds at most MAX_ARRAY_ITEMS ({MAX_ARRAY_ITEMS})")
    return ids


@lip_op(p.Detokenize)
async def detokenize(ctx: OpContext, s: WorkerSession, args: p.Detokenize) -> str:
    return await ctx.in_thread(ctx.tokenizer.decode, args.ids, args.skip_special_tokens)


@lip_op(p.ApplyChatTemplate)
async def apply_chat_template(ctx: OpContext, s: WorkerSession, args: p.ApplyChatTemplate) -> list[int]:
    try:
        template = ctx.tokenizer.apply_chat_template
        return _decodable(await ctx.in_thread(template, args.messages, args.add_generation_prompt))
    except ValueError as exc:
        raise bad(str(exc)) from None
