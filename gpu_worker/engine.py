"""Paged forward passes through vLLM's model runner, with KV pages chosen by the caller.

This is the only module that touches vLLM internals. vLLM loads the weights, sizes and allocates
the paged KV tensors and runs its attention kernels; its own scheduler and block pool decide
nothing. Each :class:`~gpu_worker.batch.Batch` becomes a hand-built V1 ``SchedulerOutput``:
``NewRequestData.block_ids`` is the page table KVFS chose, ``num_computed_tokens`` the tokens
already in those pages and ``num_scheduled_tokens`` the new tokens (positions are then implicit
and contiguous). The runner's ``execute_model()`` runs the forward; we read the full hidden states
it keeps for sampling and project exactly the rows each caller asked for (several rows per
sequence for scoring / speculative LIPs, where vLLM itself would give only the last), then call
``sample_tokens(None)`` to close the step.

Each sequence keeps a persistent runner request across calls (vLLM's CachedRequestData path), so
a decode step costs O(new tokens) of host work, not O(context). vLLM assumes the next input token
is the one its sampler produced; a LIP chooses its own, so before each step the request's tail is
overwritten with the LIP's tokens. When a call does not extend exactly what the request holds
(truncate, reload onto other pages, a reused id) the old request is retired and a fresh one is
registered with ``num_computed_tokens`` and the given page table; token ids of already-computed
positions are never read by the kernels, so they are passed as zeros.

Only one live ``Engine`` may exist per process (vLLM keeps global state); ``close()`` one before
creating the next.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import shutil
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from gpu_worker.batch import Batch, SeqWork

log = logging.getLogger(__name__)

#: vLLM-CPU start-up check: the share of NUMA node 0's memory that must be free.
CPU_MEMORY_UTILIZATION = 0.2


@dataclass(frozen=True)
class EngineConfig:
    """How to load the model and size the KV cache."""

    model_dir: str
    #: "auto" keeps the checkpoint's dtype (bf16 for the default model); tests use "float32".
    dtype: str = "auto"
    #: Exact number of KV pages (page 0 included, never handed out); else sized by kv_cache_gib.
    num_pages: int | None = None
    kv_cache_gib: float = 1.0
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 64
    #: Most tokens one sequence may hold; must be below the model's own limit (vLLM gets +1).
    max_model_len: int = 4096
    seed: int = 0
    #: On CPU, let vLLM compile the model (its CPU default: one Dynamo trace, Inductor code);
    #: False runs it eagerly. Ignored on a GPU, which runs vLLM's own default.
    compile: bool = False
    #: Where compiled code is cached across restarts (vLLM's and Inductor's caches).
    compile_cache_dir: str | None = None


def _configure_vllm_env(config: EngineConfig, on_cpu: bool) -> None:
    """Pin the vLLM execution mode this adapter is written against (before importing vLLM)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    if on_cpu:
        # vLLM-CPU sizes its KV cache in whole GiB; an explicit num_pages overrides it.
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, math.ceil(config.kv_cache_gib)))
    if on_cpu and config.compile:
        # vLLM 0.32 saves an AOT artifact of the CPU compile but cannot load it back ("'function'
        # object has no attribute 'finalize_loading'": the CPU backend compiles with plain
        # Inductor, not vLLM's backend), so every start compiled for minutes. Without AOT the
        # model is traced again at each start and Inductor's own caches serve the compiled code.
        os.environ.setdefault("VLLM_USE_AOT_COMPILE", "0")
    if config.compile_cache_dir:
        os.environ["VLLM_CACHE_ROOT"] = os.path.join(config.compile_cache_dir, "vllm")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(config.compile_cache_dir, "inductor")


def set_cpu_threads_of_this_thread(n: int) -> None:
    """Give the calling thread's torch ops ``n`` CPU threads; other threads keep theirs.

    Why: with torch's OpenMP backend the thread count is per calling thread. The worker's
    event loop and helper pools run small per-token ops (sampling, masks, argmax over one
    vocabulary row); split over 2 OpenMP threads on a CPU the forward or the LIPs also use,
    each such op waits at a barrier for a descheduled thread and takes 10-30 ms instead of
    0.1 ms. The engine thread keeps the forward's thread count (:meth:`Engine.claim_forward_thread`).
    ``torch._C.set_num_threads``: vLLM's CPU worker replaces ``torch.set_num_threads`` with a
    no-op that only warns, after binding its own threads.
    """
    # A thread's first torch call copies the process-wide count into the thread (lazily);
    # make that happen now, or it would later overwrite the count set here.
    torch.get_num_threads()
    torch._C.set_num_threads(max(1, int(n)))


@contextlib.contextmanager
def cpu_threads(n: int) -> Iterator[None]:
    """Run the block's torch ops on ``n`` CPU threads of the calling thread, then restore its count.

    The engine thread keeps the forward's count; it picks tokens between forwards on one
    thread, for the reason :func:`set_cpu_threads_of_this_thread` gives."""
    before = torch.get_num_threads()
    if before == n:
        yield
        return
    set_cpu_threads_of_this_thread(n)
    try:
        yield
    finally:
        set_cpu_threads_of_this_thread(before)


def _cxx_compiler() -> str | None:
    """The C++ compiler Inductor would use on CPU (``CXX``, else ``g++`` / ``c++``), if any."""
    for name in (os.environ.get("CXX"), "g++", "c++"):
        if name and shutil.which(name):
            return name
    return None


@dataclass
class _SeqState:
    """The runner request currently standing for a sequence, and what its KV holds."""

    req_id: str
    total_tokens: int
    page_ids: tuple[int, ...]


class Engine:
    """A vLLM model runner driven page-by-page by the caller (see module docstring)."""

    def __init__(self, config: EngineConfig) -> None:
        on_cpu = not torch.cuda.is_available()
        if on_cpu and config.compile and not _cxx_compiler():
            # Inductor's CPU code is C++: without a compiler the warm-up compile would fail.
            log.warning("event=compile_unavailable why=no_cxx_compiler running=eager")
            config = dataclasses.replace(config, compile=False)
        self.config = config
        _configure_vllm_env(config, on_cpu)

        from vllm import LLM, SamplingParams

        kwargs: dict[str, Any] = {}
        if config.num_pages is not None:
            if config.num_pages < 2:
                raise ValueError("num_pages must be >= 2 (page 0 is reserved)")
            kwargs["num_gpu_blocks_override"] = config.num_pages
        elif not on_cpu:
            kwargs["kv_cache_memory_bytes"] = int(config.kv_cache_gib * (1 << 30))
        if on_cpu:
            # The KV cache is sized by VLLM_CPU_KVCACHE_SPACE / num_pages; without this, vLLM-CPU
            # refuses to start unless ~90% of the NUMA node's memory is free.
            kwargs["gpu_memory_utilization"] = CPU_MEMORY_UTILIZATION
        self._llm = LLM(
            model=config.model_dir,
            tokenizer=config.model_dir,
            dtype=config.dtype,
            seed=config.seed,
            # One slot more than a sequence may hold: the runner writes its own sampled token
            # after the last position of every step (see _continue).
            max_model_len=config.max_model_len + 1,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_num_seqs=config.max_num_seqs,
            enforce_eager=on_cpu and not config.compile,
            enable_prefix_caching=False,
            async_scheduling=False,
            **kwargs,
        )
        self._core = self._llm.llm_engine.engine_core.engine_core
        #: CPU threads of a forward, as vLLM set them up in this (the constructing) thread.
        self.forward_threads = torch.get_num_threads()
        self._runner = self._core.model_executor.driver_worker.worker.model_runner
        self._sampling = SamplingParams(temperature=0.0, max_tokens=1)
        self._lock = threading.RLock()
        self._seqs: dict[str, _SeqState] = {}
        self._finished: set[str] = set()
        self._counters = {"forwards": 0, "tokens": 0, "new_requests": 0, "continued_requests": 0}
        self._step = 0

        self.device: str = "cpu" if on_cpu else str(self._runner.device)
        #: Whether the model runs compiled (vLLM's torch.compile) rather than eagerly.
        self.compiled: bool = not on_cpu or config.compile
        self.block_size: int = int(self._runner.cache_config.block_size)
        self.num_pages: int = int(self._runner.kv_cache_config.num_blocks)
        self.vocab_size: int = int(self._runner.model_config.get_vocab_size())
        #: What the model computes in (``torch.float32``, ``torch.bfloat16``): health shows it.
        self.dtype: str = str(self._runner.model_config.dtype).removeprefix("torch.")
        # Page-major views of the per-layer KV tensors: vLLM-CPU allocates [pages, ...], the
        # CUDA flash-attention layout is [2, pages, ...]; both become [pages, ...] views.
        self._caches: list[torch.Tensor] = [self._page_major(c) for c in self._unique_caches()]
        self.page_shape: tuple[int, ...] = (len(self._caches), *self._caches[0].shape[1:])
        self.page_bytes: int = sum(c[0].numel() * c.element_size() for c in self._caches)
        log.info(
            "event=engine_ready model=%s device=%s dtype=%s compiled=%s block_size=%d num_pages=%d"
            " page_bytes=%d vocab=%d",
            config.model_dir,
            self.device,
            self._runner.model_config.dtype,
            self.compiled,
            self.block_size,
            self.num_pages,
            self.page_bytes,
            self.vocab_size,
        )

    def _unique_caches(self) -> list[torch.Tensor]:
        """Per-layer KV tensors, each storage once (layers may alias a shared allocation)."""
        seen: set[int] = set()
        caches = []
        for cache in self._runner.kv_caches:
            if cache.data_ptr() in seen:
                continue
            seen.add(cache.data_ptr())
            caches.append(cache)
        return caches

    def _page_major(self, cache: torch.Tensor) -> torch.Tensor:
        """A view of ``cache`` with the page dimension first (no copy)."""
        for dim in (0, 1):
            if cache.dim() > dim and cache.shape[dim] == self.num_pages:
                return cache.movedim(dim, 0)
        raise RuntimeError(f"unsupported KV layout {tuple(cache.shape)}: no dimension of {self.num_pages} pages")

    # --- forward ---------------------------------------------------------------------------

    def _validate(self, batch: Batch) -> None:
        if not batch.items:
            raise ValueError("empty batch")
        if len(batch.items) > self.config.max_num_seqs:
            raise ValueError(f"{len(batch.items)} sequences > max_num_seqs")
        if batch.num_tokens > self.config.max_num_batched_tokens:
            raise ValueError(f"{batch.num_tokens} tokens > max_num_batched_tokens")
        seen: set[str] = set()
        for item in batch.items:
            if item.seq_id in seen:
                raise ValueError(f"sequence {item.seq_id!r} twice in one batch")
            seen.add(item.seq_id)
            n_new = len(item.new_token_ids)
            total = item.num_computed_tokens + n_new
            if n_new == 0 or item.num_computed_tokens < 0:
                raise ValueError(f"{item.seq_id}: nothing to compute")
            if total > self.config.max_model_len:
                raise ValueError(f"{item.seq_id}: {total} tokens > max_model_len")
            if len(item.page_ids) < -(-total // self.block_size):
                raise ValueError(f"{item.seq_id}: {len(item.page_ids)} pages for {total} tokens")
            if min(item.page_ids) <= 0 or max(item.page_ids) >= self.num_pages:
                raise ValueError(f"{item.seq_id}: page id out of range 1..{self.num_pages - 1}")
            if not item.logits_rows or any(r < 0 or r >= n_new for r in item.logits_rows):
                raise ValueError(f"{item.seq_id}: logits_rows outside 0..{n_new - 1}")
            if min(item.new_token_ids) < 0 or max(item.new_token_ids) >= self.vocab_size:
                raise ValueError(f"{item.seq_id}: token id outside the vocabulary")
        for src, dst in batch.page_copies:
            if not (0 < src < self.num_pages and 0 < dst < self.num_pages):
                raise ValueError(f"page copy {src}->{dst} out of range")

    def _continues(self, item: SeqWork) -> _SeqState | None:
        """The sequence's live request if ``item`` extends exactly what it holds, else None."""
        state = self._seqs.get(item.seq_id)
        if state is None or state.req_id not in self._runner.requests:
            return None
        if item.num_computed_tokens != state.total_tokens:
            return None
        if item.page_ids[: len(state.page_ids)] != state.page_ids:
            return None
        return state

    def _continue(self, item: SeqWork, state: _SeqState) -> None:
        """Put the LIP's tokens where the runner reads its next input.

        After each step the runner has appended its own sampled token to the request; the LIP
        chose different tokens, so the request's tail is replaced in the request state (used
        when the request is re-added to the batch) and, when the request is in the persistent
        batch, in its token row (O(new tokens), not O(context)).
        """
        req_state = self._runner.requests[state.req_id]
        start = item.num_computed_tokens
        end = start + len(item.new_token_ids)
        outputs = req_state.output_token_ids
        del outputs[start - len(req_state.prompt_token_ids) :]
        outputs.extend(item.new_token_ids)
        batch = self._runner.input_batch
        index = batch.req_id_to_index.get(state.req_id)
        if index is not None:
            batch.token_ids_cpu[index, start:end] = item.new_token_ids
            batch.is_token_ids[index, start:end] = True
            batch.num_tokens_no_spec[index] = end

    def _scheduler_output(self, batch: Batch) -> tuple[Any, list[str]]:
        """Build vLLM's step description; returns it with the runner request id of each item."""
        from vllm.v1.core.kv_cache_utils import KVCacheBlockCopy
        from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput

        new_reqs = []
        cached = CachedRequestData.make_empty()
        num_scheduled: dict[str, int] = {}
        req_ids: list[str] = []
        finished, self._finished = self._finished, set()
        for item in batch.items:
            state = self._continues(item)
            if state is not None:
                self._continue(item, state)
                self._counters["continued_requests"] += 1
                extra = list(item.page_ids[len(state.page_ids) :])
                req_id = state.req_id
                cached.req_ids.append(req_id)
                cached.new_token_ids.append([])
                cached.new_block_ids.append((extra,) if extra else None)
                cached.num_computed_tokens.append(item.num_computed_tokens)
                cached.num_output_tokens.append(len(self._runner.requests[req_id].output_token_ids))
            else:
                old = self._seqs.get(item.seq_id)
                if old is not None:
                    finished.add(old.req_id)
                self._step += 1
                self._counters["new_requests"] += 1
                req_id = f"{item.seq_id}#{self._step}"
                new_reqs.append(
                    NewRequestData(
                        req_id=req_id,
                        # Tokens of computed positions are never read by the kernels.
                        prompt_token_ids=[0] * item.num_computed_tokens + list(item.new_token_ids),
                        mm_features=[],
                        sampling_params=self._sampling,
                        pooling_params=None,
                        block_ids=(list(item.page_ids),),
                        num_computed_tokens=item.num_computed_tokens,
                        lora_request=None,
                    )
                )
            num_scheduled[req_id] = len(item.new_token_ids)
            req_ids.append(req_id)
            self._seqs[item.seq_id] = _SeqState(
                req_id, item.num_computed_tokens + len(item.new_token_ids), item.page_ids
            )
        copies = [KVCacheBlockCopy(src, dst) for src, dst in batch.page_copies]
        out = SchedulerOutput(
            scheduled_new_reqs=new_reqs,
            scheduled_cached_reqs=cached,
            num_scheduled_tokens=num_scheduled,
            total_num_scheduled_tokens=batch.num_tokens,
            scheduled_spec_decode_tokens={},
            scheduled_encoder_inputs={},
            finished_req_ids=finished,
            free_encoder_mm_hashes=[],
            kv_cache_block_copies=copies or None,
        )
        return out, req_ids

    @torch.inference_mode()
    def forward(self, batch: Batch) -> list[torch.Tensor]:
        """Run one forward; per item, float32 logits ``[len(logits_rows), vocab_size]``.

        ``batch.page_copies`` are applied before the forward. New tokens' KV is written into the
        item's pages at positions ``num_computed_tokens..``.
        """
        self._validate(batch)
        with self._lock:
            if self._runner is None:
                raise RuntimeError("engine is closed")
            out, req_ids = self._scheduler_output(batch)
            try:
                self._runner.execute_model(out)
            except BaseException:
                # The runner's view of these sequences is unknown now: start them afresh.
                for item in batch.items:
                    self.release(item.seq_id)
                raise
            state = self._runner.execute_model_state
            if state is None:
                raise RuntimeError("vLLM runner produced no model state for the batch")
            self._counters["forwards"] += 1
            self._counters["tokens"] += batch.num_tokens
            order = [rid for rid in self._runner.input_batch.req_ids if rid is not None]
            logits = self._select_logits(batch, req_ids, order, out.num_scheduled_tokens, state)
            self._runner.sample_tokens(None)
        logits = logits[:, : self.vocab_size].float()
        return list(torch.split(logits, [len(item.logits_rows) for item in batch.items]))

    def _select_logits(
        self,
        batch: Batch,
        req_ids: list[str],
        order: list[str],
        num_scheduled: dict[str, int],
        state: Any,
    ) -> torch.Tensor:
        """Logits of the requested rows, in batch order.

        ``order`` is the runner's row order (it may reorder requests, e.g. decodes first).
        When only last rows are asked for, the logits the runner computed for sampling are
        reused; otherwise the requested rows of the full hidden states are projected.
        """
        position = {req_id: i for i, req_id in enumerate(order)}
        last_only = all(item.logits_rows == (len(item.new_token_ids) - 1,) for item in batch.items)
        if last_only and state.logits is not None and state.logits.shape[0] == len(order):
            index = torch.tensor([position[r] for r in req_ids], device=state.logits.device)
            return state.logits.index_select(0, index)
        offsets: dict[str, int] = {}
        offset = 0
        for req_id in order:
            offsets[req_id] = offset
            offset += num_scheduled[req_id]
        rows = [
            offsets[req_id] + r for item, req_id in zip(batch.items, req_ids, strict=True) for r in item.logits_rows
        ]
        hidden = state.hidden_states
        index = torch.tensor(rows, dtype=torch.long, device=hidden.device)
        return self._runner.model.compute_logits(hidden.index_select(0, index))

    def stats(self) -> dict[str, int]:
        """Counters since start: forwards, tokens, new_requests, continued_requests.

        ``continued_requests`` are items served by a sequence's persistent runner request;
        ``new_requests`` had to register one (first call, or after truncate / fork / reload).
        """
        with self._lock:
            return dict(self._counters, live_sequences=len(self._seqs))

    def claim_forward_thread(self) -> None:
        """Call from the thread that will run :meth:`forward`: it gets the forward's CPU threads,
        whatever count other threads set (see :func:`set_cpu_threads_of_this_thread`)."""
        set_cpu_threads_of_this_thread(self.forward_threads)

    def release(self, seq_id: str) -> None:
        """Forget the sequence's runner request (its state is dropped at the next step)."""
        with self._lock:
            state = self._seqs.pop(seq_id, None)
            if state is not None:
                self._finished.add(state.req_id)

    # --- page data (KVFS swap and copy-on-write) ------------------------------------------

    def _index(self, page_ids: Sequence[int]) -> torch.Tensor:
        ids = list(page_ids)
        if any(p < 0 or p >= self.num_pages for p in ids):
            raise ValueError(f"page id out of range 0..{self.num_pages - 1}")
        return torch.tensor(ids, dtype=torch.long, device=self._live_caches()[0].device)

    def read_pages(self, page_ids: Sequence[int]) -> torch.Tensor:
        """CPU copy of the pages over all layers: ``[n, *page_shape]``.

        Not under the forward's lock, so a spill or reload overlaps a running forward instead
        of waiting for it to end (with the lock, a LIP's ``kv_open`` of a spilled file waited
        up to a whole forward, then held the KVFS lock through the copy while the engine
        waited for it). That is safe because KVFS moves only pages no forward writes: an idle
        file's (no handle, no pending plan; a forward may read shared ones, never write them,
        as a fork's append copies a shared page first) or, for :meth:`write_pages`, fresh pages
        nothing references yet. The tensors are taken once, so :meth:`close` cannot free them
        mid-copy."""
        index = self._index(page_ids)
        caches = self._live_caches()
        # Gathered layer by layer straight into one layer-major buffer and returned as its
        # ``[n, layers, ...]`` view: no second copy to stack the layers (a 47 MB spill took
        # 29 ms stacked, 22 ms this way, on one CPU thread here). The view is non-contiguous;
        # ``write_pages`` reads it a layer at a time and ``encode`` makes it contiguous.
        out = torch.empty((len(caches), len(index), *caches[0].shape[1:]), dtype=caches[0].dtype)
        for layer, cache in enumerate(caches):
            if cache.device.type == "cpu":
                torch.index_select(cache, 0, index, out=out[layer])
            else:
                out[layer].copy_(cache.index_select(0, index))
        return out.transpose(0, 1)

    def write_pages(self, page_ids: Sequence[int], data: torch.Tensor) -> None:
        """Overwrite the pages with ``data`` as returned by :meth:`read_pages` (see there why
        without the forward's lock)."""
        index = self._index(page_ids)
        expected = (len(index), *self.page_shape)
        if tuple(data.shape) != expected:
            raise ValueError(f"page data shape {tuple(data.shape)} != {expected}")
        for layer, cache in enumerate(self._live_caches()):
            cache.index_copy_(0, index, data[:, layer].to(cache.device, cache.dtype))

    def _live_caches(self) -> list[torch.Tensor]:
        """The KV tensors, or an error once :meth:`close` dropped them (it rebinds the list)."""
        caches = self._caches
        if not caches:
            raise RuntimeError("engine is closed")
        return caches

    def close(self) -> None:
        """Shut the in-process engine core down and free the KV cache."""
        with self._lock:
            core = getattr(self, "_core", None)
            if core is not None:
                core.shutdown()
                self._core = None
            # Drop every reference to the weights and KV tensors so a later Engine in this
            # process starts from free memory.
            self._caches = []
            self._runner = None
            self._llm = None
