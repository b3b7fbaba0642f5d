"""The vLLM baseline: the offline ``vllm.LLM`` engine with automatic prefix caching on.

Same model, dtype, max batch and the same number of KV blocks as the Symphony worker's device
pages (``num_gpu_blocks_override``), so any difference comes from what each system does with
that memory, not from how much it has. Both vLLM and the worker hold one block back (vLLM's
null block, the worker's page 0), so equal counts mean equal usable capacity.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class GenStats:
    """One ``generate`` call: wall time, tokens produced and prompt tokens served from cache."""

    elapsed_s: float
    requests: int
    output_tokens: int
    prompt_tokens: int
    cached_prompt_tokens: int
    #: Generated token ids per request (client loops append them to the next prompt).
    outputs: tuple[list[int], ...] = ()

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.elapsed_s

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.elapsed_s


def engine_settings(
    model: str,
    num_blocks: int,
    dtype: str,
    max_num_seqs: int,
    max_model_len: int,
    max_num_batched_tokens: int,
    enable_prefix_caching: bool = True,
) -> dict[str, Any]:
    """vLLM engine arguments every baseline shares (the offline engine and ``vllm serve``), so
    both get the worker's KV budget and batch limits the same way."""
    import torch

    on_cpu = not torch.cuda.is_available()
    return {
        "model": model,
        "tokenizer": model,
        "dtype": dtype,
        "seed": 0,
        "max_model_len": max_model_len,
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": max_num_batched_tokens,
        "enable_prefix_caching": enable_prefix_caching,
        "num_gpu_blocks_override": num_blocks,
        # Compiled or eager as the worker is (its --compile default, SYMPHONY_COMPILE), so both
        # sides run the same model code.
        "enforce_eager": on_cpu and not worker_compiles(),
        # On CPU this is the share of *host* memory vLLM insists is free at start-up; the KV size
        # is fixed by num_gpu_blocks_override, so a small value only avoids a refusal to start on
        # a machine other processes share.
        "gpu_memory_utilization": 0.2 if on_cpu else 0.5,
    }


def worker_compiles() -> bool:
    """Whether a worker started now compiles its model (its ``--compile`` default,
    ``SYMPHONY_COMPILE``): a baseline in this process runs the same model code."""
    from gpu_worker.config import env_defaults

    return env_defaults()["compile"] == "on"


class VLLMBaseline:
    """An in-process ``vllm.LLM`` (only one engine per process: the worker runs elsewhere)."""

    def __init__(
        self,
        model: str,
        num_blocks: int,
        *,
        dtype: str = "float32",
        max_num_seqs: int = 64,
        max_model_len: int = 2048,
        max_num_batched_tokens: int = 2048,
        enable_prefix_caching: bool = True,
        **extra: Any,
    ) -> None:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        from vllm import LLM

        limits = (max_num_seqs, max_model_len, max_num_batched_tokens)
        settings = engine_settings(model, num_blocks, dtype, *limits, enable_prefix_caching)
        self.model = model
        self.llm = LLM(**settings, **extra)
        config = self.llm.llm_engine.vllm_config
        cache = config.cache_config
        self.block_size: int = int(cache.block_size)
        self.num_blocks: int = int(cache.num_gpu_blocks or num_blocks)
        self.max_num_seqs: int = int(config.scheduler_config.max_num_seqs)
        self.dtype: str = str(config.model_config.dtype).removeprefix("torch.")
        self.compiled: bool = not settings["enforce_eager"]

    def resources(self) -> dict[str, Any]:
        """This side's entry of the record's ``protocol.sides``: the engine runs its forward in
        this process (on the thread that built it), so its thread count is this thread's torch
        threads, its CPUs this process's, its KV blocks the engine's own."""
        import torch

        from bench.harness import this_process_env
        from bench.resources import kv_page_bytes, side

        return side(
            pid=os.getpid(),
            env=this_process_env(),
            dtype=self.dtype,
            max_batch=self.max_num_seqs,
            kv_pages=self.num_blocks,
            page_bytes=kv_page_bytes(self.model, self.dtype, self.block_size),
            forward_threads=torch.get_num_threads(),
            compiled=self.compiled,
        )

    def generate(self, prompts: list[list[int]], max_tokens: int) -> GenStats:
        """Greedy, ``ignore_eos`` (fixed output length, as the Symphony LIPs do)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        inputs = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        start = time.perf_counter()
        outs = self.llm.generate(inputs, params, use_tqdm=False)
        elapsed = time.perf_counter() - start
        return GenStats(
            elapsed_s=elapsed,
            requests=len(outs),
            output_tokens=sum(len(o.outputs[0].token_ids) for o in outs),
            prompt_tokens=sum(len(p) for p in prompts),
            cached_prompt_tokens=sum(o.num_cached_tokens or 0 for o in outs),
            outputs=tuple(list(o.outputs[0].token_ids) for o in outs),
        )

    def reset_prefix_cache(self) -> None:
        self.llm.reset_prefix_cache()

    def close(self) -> None:
        engine = getattr(self.llm.llm_engine, "engine_core", None)
        core = getattr(engine, "engine_core", None)
        if core is not None:
            core.shutdown()
        self.llm = None
