"""A grammar state's mask, applied the worker's way, against xgrammar's own apply."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from gpu_worker import protocol
from gpu_worker.dists import restrict
from gpu_worker.grammar import GrammarCompiler, Matcher
from gpu_worker.protocol import ErrorCode, ProtocolError

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


async def _compile(compiler: GrammarCompiler, schema: dict) -> object:
    """One compile the worker's way (in a child process), then the children stopped."""
    await compiler.start()
    try:
        return await compiler.compile(protocol.Grammar(json_schema=schema), "u1")
    finally:
        await compiler.close()


def test_restrict_matches_xgrammar_along_a_valid_answer(default_model_dir: Path) -> None:
    """At every step of a valid answer (sparse masks between keys, dense ones inside the
    string) the worker's mask keeps exactly the logits xgrammar's apply keeps."""
    import xgrammar as xgr
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(default_model_dir))
    vocab = len(tokenizer)
    matcher = Matcher(asyncio.run(_compile(GrammarCompiler(str(default_model_dir), vocab), SCHEMA)), vocab)
    answer = tokenizer(json.dumps({"name": "Ada Lovelace", "age": 36}, separators=(",", ":")))["input_ids"]
    generator = torch.Generator().manual_seed(0)
    kept = []
    for token in answer:
        logits = torch.randn(vocab, generator=generator)
        ours = matcher.restrict(logits)
        reference = logits.clone().unsqueeze(0)
        xgr.apply_token_bitmask_inplace(reference, matcher._bitmask)
        assert torch.equal(ours, reference[0])
        kept.append(int(torch.isfinite(ours).sum()))
        assert matcher.advance(token)["accepted"]
    assert min(kept) < vocab // 4 < max(kept), f"both mask shapes should occur: {kept}"


def test_restrict_sparse_dense_empty_and_none() -> None:
    logits = torch.arange(8, dtype=torch.float32)
    sparse = np.zeros(8, dtype=bool)
    sparse[[2, 5]] = True
    assert restrict(logits, sparse).tolist() == [-np.inf, -np.inf, 2.0, -np.inf, -np.inf, 5.0, -np.inf, -np.inf]
    dense = ~sparse
    assert torch.isinf(restrict(logits, dense)).tolist() == sparse.tolist()
    assert restrict(logits.double(), dense).dtype == torch.float64
    assert logits.tolist() == list(range(8)), "the row itself is left as it was"
    with pytest.raises(ProtocolError) as caught:
        restrict(logits, np.zeros(8, dtype=bool))
    assert caught.value.code == ErrorCode.BAD_ARGS
    with pytest.raises(ValueError):
        restrict(logits, np.ones(7, dtype=bool))
    assert restrict(logits, None) is logits


def test_a_compiled_grammar_over_the_size_budget_is_refused_naming_it(default_model_dir: Path) -> None:
    """The child measures what it compiled (xgrammar's own size) against ``grammar_max_bytes``
    and answers an error instead of the grammar."""
    import xgrammar as xgr
    from transformers import AutoTokenizer

    from gpu_worker.grammar_child import compile_one

    info = xgr.TokenizerInfo.from_huggingface(AutoTokenizer.from_pretrained(str(default_model_dir)))
    compiler = xgr.GrammarCompiler(info, max_threads=1)
    source = json.dumps(SCHEMA)
    fits = compile_one(compiler, "json_schema", source, 64 * 1024 * 1024)
    assert isinstance(fits.get("ok"), str)
    refused = compile_one(compiler, "json_schema", source, 1024)
    assert "grammar_max_bytes" in refused["err"] and "over the grammar budget of 1024" in refused["err"], refused
