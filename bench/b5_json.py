"""B5 — JSON output under a schema: the worker-side grammar mask vs vLLM structured outputs.

Workload: ``requests`` chat prompts ("describe person #i as JSON") with one JSON schema (bounded
strings, an integer range, enums, a short array: every valid object is short, so ``max_tokens``
never cuts a well-behaved answer), greedy, ``max_batch`` at once on both sides.

Symphony side: ``max_batch`` LIP sessions (threads), each compiles the schema with
``grammar(schema)`` (compiled once in the worker, cached by source) and per request decodes
with fused ``pred(..., then=argmax(mask=state, advance=true))`` (``mask=state.advancing()``) —
the mask is applied in the worker, next to the logits, and the worker feeds the chosen token to
the grammar state, so a token costs one round trip — until EOS (which the grammar only allows
once the object is complete). No trailing forward for the last token (vLLM does not do one either).

Baseline: ``LLM.generate`` with ``SamplingParams(structured_outputs=StructuredOutputsParams(json=
schema, disable_any_whitespace=True))`` (vllm 0.32; xgrammar backend) — compact JSON on both
sides, since the worker compiles schemas with ``any_whitespace=False``.

Figures: output tokens/s (EOS counted on both sides) and requests/s; the share of Symphony's
(and vLLM's) outputs that parse and validate against the schema (``jsonschema``): target 100%.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Any

from bench.baseline_vllm import VLLMBaseline
from bench.harness import (
    BenchConfig,
    BenchResult,
    Comparison,
    WorkerOptions,
    WorkerProcess,
    max_len_for,
    repetition_starts,
    run_standalone,
    share_out,
    stopwatch,
    workload_args,
)

NAME = "b5_json"
TENANT = "bench-b5"

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Z][a-z]{1,10}$"},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"type": "string", "enum": ["engineer", "doctor", "teacher", "artist"]},
        "active": {"type": "boolean"},
        "skills": {
            "type": "array",
            "items": {"type": "string", "enum": ["python", "sql", "rust", "go"]},
            "maxItems": 3,
        },
    },
    "required": ["name", "age", "role", "active", "skills"],
    "additionalProperties": False,
}


@dataclass(frozen=True)
class Workload:
    requests: int = 32
    max_batch: int = 16
    max_tokens: int = 64

    def pages(self, block_size: int) -> int:
        """Prompts are < 128 tokens: at most two pages per sequence in flight, plus page 0."""
        return 1 + self.max_batch * (-(-(128 + self.max_tokens) // block_size))


QUICK = Workload(requests=4, max_batch=4, max_tokens=48)


def prompts(model: str, n: int) -> list[list[int]]:
    """Chat-formatted prompt token ids (the same ids go to both sides)."""
    from gpu_worker.tokenizer import Tokenizer

    tok = Tokenizer(model)
    ask = (
        "Invent person number {i} for a test database and answer only with a JSON object with the keys "
        "name, age, role (engineer, doctor, teacher or artist), active and skills."
    )
    return [tok.apply_chat_template([{"role": "user", "content": ask.format(i=i)}]) for i in range(n)]


@dataclass
class Outputs:
    """Generated token ids per request of one repetition (for validation)."""

    tokens: list[list[int]] = field(default_factory=list)


def symphony_side(worker: WorkerProcess, wl: Workload, ps: list[list[int]], outs: Outputs) -> tuple[float, float]:
    """(tokens/s, requests/s) of the grammar-masked LIP."""
    sessions = [worker.connect(TENANT) for _ in range(min(wl.max_batch, len(ps)))]
    # One compiled grammar per session (compiled lazily by the session's first request).
    grammars: dict[int, Any] = {}

    def generate(k: int, prompt: list[int]) -> tuple[int, list[int]]:
        """One request: (tokens produced, EOS included; the object's tokens)."""
        sess = sessions[k][0]
        eos = set(sess.info.eos_token_ids)
        if k not in grammars:
            grammars[k] = sess.grammar(SCHEMA)
        kv = sess.kv_create()
        state = grammars[k].state()
        pending, text, n = prompt, [], 0
        for _ in range(wl.max_tokens):
            tok = sess.pred_token(kv, pending, mask=state.advancing())
            n += 1
            if tok in eos:
                break
            text.append(tok)
            pending = [tok]
        sess.kv_close(kv)
        return n, text

    try:
        with stopwatch() as t:
            done = share_out(ps, len(sessions), generate)
    finally:
        for sess, sid in sessions:
            worker.end(sess, sid)
    outs.tokens = [text for _, text in done]
    return sum(n for n, _ in done) / t[0], len(ps) / t[0]


def baseline_side(base: VLLMBaseline, wl: Workload, ps: list[list[int]], outs: Outputs) -> tuple[float, float]:
    """(tokens/s, requests/s) of vLLM structured outputs on the same prompts."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import StructuredOutputsParams

    so = StructuredOutputsParams(json=SCHEMA)
    params = SamplingParams(temperature=0.0, max_tokens=wl.max_tokens, structured_outputs=so)
    with stopwatch() as t:
        res = base.llm.generate([TokensPrompt(prompt_token_ids=p) for p in ps], params, use_tqdm=False)
    outs.tokens = [list(r.outputs[0].token_ids) for r in res]
    return sum(len(x) for x in outs.tokens) / t[0], len(ps) / t[0]


def valid_share(model: str, outputs: list[list[int]]) -> tuple[float, list[str]]:
    """Share of outputs that are JSON and validate against :data:`SCHEMA`; first invalid texts."""
    import jsonschema

    from gpu_worker.tokenizer import Tokenizer

    tok = Tokenizer(model)
    validator = jsonschema.Draft202012Validator(SCHEMA)
    bad: list[str] = []
    for ids in outputs:
        text = tok.decode(ids, skip_special_tokens=True)
        try:
            validator.validate(json.loads(text))
        except (ValueError, jsonschema.ValidationError):
            bad.append(text)
    return 1 - len(bad) / max(1, len(outputs)), bad[:3]


def run(worker: WorkerProcess, base: VLLMBaseline, cfg: BenchConfig, wl: Workload, result: BenchResult) -> None:
    """Interleaved reps on the same prompts (greedy: a rep repeats the same outputs), validation."""
    ps = prompts(cfg.model, wl.requests)
    tok = Comparison("json schema", "tok/s")
    req = Comparison("json schema", "req/s")
    sym_out, base_out = Outputs(), Outputs()
    for i in range(cfg.reps):
        repetition_starts()
        sides = [
            (lambda: symphony_side(worker, wl, ps, sym_out), (tok.symphony, req.symphony)),
            (lambda: baseline_side(base, wl, ps, base_out), (tok.baseline, req.baseline)),
        ]
        for fn, (a, b) in sides if i % 2 == 0 else reversed(sides):
            t, r = fn()
            a.add(t)
            b.add(r)
    sym_valid, sym_bad = valid_share(cfg.model, sym_out.tokens)
    base_valid, base_bad = valid_share(cfg.model, base_out.tokens)
    tok.extra.update(
        target="100% schema-valid; >= 0.9x vLLM structured-output speed",
        symphony_schema_valid=sym_valid,
        baseline_schema_valid=base_valid,
        symphony_invalid_examples=sym_bad,
        baseline_invalid_examples=base_bad,
        # vLLM's token ids end with the EOS the grammar allowed; the LIP's results stop before it.
        same_outputs=sum(
            a == b[: len(a)] and len(b) - len(a) <= 1 for a, b in zip(sym_out.tokens, base_out.tokens, strict=True)
        ),
        example=sym_out.tokens[0] and _text(cfg.model, sym_out.tokens[0]),
        baseline_example=base_out.tokens[0] and _text(cfg.model, base_out.tokens[0]),
        mean_output_tokens={
            "symphony": sum(map(len, sym_out.tokens)) / len(sym_out.tokens),
            "baseline": sum(map(len, base_out.tokens)) / len(base_out.tokens),
        },
    )
    req.name = "json schema (requests)"
    result.comparisons += [tok, req]
    result.notes.append(f"schema-valid: Symphony {sym_valid:.0%}, vLLM {base_valid:.0%}")


def _text(model: str, ids: list[int]) -> str:
    from gpu_worker.tokenizer import Tokenizer

    return Tokenizer(model).decode(ids, skip_special_tokens=True)


def main(argv: list[str] | None = None) -> int:
    cfg, wl = workload_args(argv, __doc__ or NAME, Workload(), QUICK)
    opts = WorkerOptions(
        model=cfg.model,
        num_pages=wl.pages(128),
        dtype=cfg.dtype,
        max_model_len=max_len_for(128 + wl.max_tokens),
        max_num_seqs=wl.max_batch,
    )
    # The engine-wide flag is the one vLLM's xgrammar backend reads (the per-request one in
    # StructuredOutputsParams is not): without it vLLM's JSON came out indented.
    compact = {"structured_outputs_config": {"backend": "xgrammar", "disable_any_whitespace": True}}
    run_standalone(NAME, cfg, wl, opts, lambda w, b, r: run(w, b, cfg, wl, r), **compact)
    return 0


if __name__ == "__main__":
    sys.exit(main())
