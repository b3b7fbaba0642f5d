"""B6 — ReAct agents: tool calls through brokered I/O with KV kept vs a client re-sending prompts.

Workload: ``agents`` agents; each starts from its own ``prompt_tokens`` prompt and runs
``tool_calls`` rounds of: decode ``think_tokens`` greedy tokens (the "thought + action"), call a
tool over HTTP, append the tool's observation; then decodes a final ``think_tokens`` answer.
The tool is :class:`ToolServer`: a threaded ``http.server`` on 127.0.0.1 in this process that
answers after a fixed ``tool_latency_ms`` with a deterministic observation text (so both sides
append exactly the same tokens).

Symphony side: one LIP session per agent (a thread each), ``allowed_hosts=["127.0.0.1:<port>"]``
in ``create_session`` limits. The LIP keeps its KV file across the whole episode: each round
appends only the new tokens (last decoded token + observation); the tool is called with
``http_fetch`` (the worker performs it; the session counts as blocked on I/O meanwhile, and
past ``io_swap_threshold_s`` its private pages could be swapped to host).

Baselines, both re-sending every agent's whole growing prompt each round (APC on, so full
cached blocks are reused and the tail is recomputed):

* ``vllm serve`` (the spec's baseline, :mod:`bench.baseline_server`): one client thread per agent
  with its own keep-alive HTTP connection, each running its own loop of ``/v1/completions`` →
  tool call → append, so the server batches whatever agents are between tool calls. Full mode
  only (``--serve-baseline 0`` skips it; starting a second vLLM costs ~30 s on 2 CPU cores).
* a lock-step client loop over the offline ``vllm.LLM`` engine: one ``generate`` batch per
  round, then every agent's tool concurrently. This is the *best case* for a client loop
  (perfect batching, no HTTP/JSON overhead) and is reported as a second, stronger ratio.

Figure: episodes per second (agents ÷ wall) and the same as output tokens/s.
"""

from __future__ import annotations

import concurrent.futures
import json
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from bench.baseline_server import VLLMServer
from bench.baseline_vllm import VLLMBaseline
from bench.harness import (
    BenchConfig,
    BenchResult,
    Comparison,
    Sample,
    WorkerOptions,
    WorkerProcess,
    baseline_blocks,
    fill_sides,
    max_len_for,
    random_tokens,
    repetition_starts,
    run_standalone,
    run_threads,
    stopwatch,
    workload_args,
)

NAME = "b6_react"
TENANT = "bench-b6"


@dataclass(frozen=True)
class Workload:
    agents: int = 16
    tool_calls: int = 4
    prompt_tokens: int = 256
    think_tokens: int = 32
    tool_latency_ms: float = 50.0
    #: 1: also measure the client loop over ``vllm serve`` (the spec's baseline); 0: skip it.
    serve_baseline: int = 1

    def episode_tokens(self, obs_tokens: int) -> int:
        return self.prompt_tokens + (self.tool_calls + 1) * self.think_tokens + self.tool_calls * obs_tokens

    def pages(self, block_size: int, obs_tokens: int = 48) -> int:
        return 1 + self.agents * -(-self.episode_tokens(obs_tokens) // block_size)


QUICK = Workload(agents=4, tool_calls=2, prompt_tokens=64, think_tokens=4, tool_latency_ms=20.0, serve_baseline=0)


def observation(agent: int, step: int) -> str:
    """The tool's answer (deterministic: both sides must append the same tokens)."""
    return f"\nObservation: lookup #{step} for agent {agent} returned 3 rows: alpha={agent * 7 + step}, ok=true\n"


class _Handler(BaseHTTPRequestHandler):
    latency_s = 0.05

    def do_GET(self) -> None:
        q = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
        time.sleep(self.latency_s)
        body = json.dumps({"observation": observation(int(q["agent"][0]), int(q["step"][0]))}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


class ToolServer:
    """The local HTTP tool: one thread per request, fixed latency (a stand-in for a search API)."""

    def __init__(self, latency_s: float) -> None:
        handler = type("Handler", (_Handler,), {"latency_s": latency_s})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.host = f"127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, agent: int, step: int) -> str:
        return f"http://{self.host}/tool?agent={agent}&step={step}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@dataclass
class Timings:
    """Where the Symphony agents' time went (per tool call, seconds)."""

    fetch_s: list[float] = field(default_factory=list)
    #: Sessions the worker swapped out while their tool call was pending.
    swaps: int = 0


def obs_tokens(model: str, wl: Workload) -> list[list[list[int]]]:
    """Observation token ids per (agent, step), tokenized once here for the baseline."""
    from gpu_worker.tokenizer import Tokenizer

    tok = Tokenizer(model)
    return [[tok.encode(observation(a, s)) for s in range(wl.tool_calls)] for a in range(wl.agents)]


def symphony_side(
    worker: WorkerProcess, wl: Workload, tool: ToolServer, ps: list[list[int]], timings: Timings
) -> tuple[float, int]:
    """(episodes/s, output tokens) of ``agents`` LIPs with brokered tool calls and kept KV."""
    sessions = [worker.connect(TENANT, {"allowed_hosts": [tool.host]}) for _ in range(wl.agents)]

    def agent(a: int) -> int:
        sess = sessions[a][0]
        kv = sess.kv_create()
        pending = ps[a]
        n = 0
        for step in range(wl.tool_calls + 1):
            for _ in range(wl.think_tokens):
                tok = sess.pred_token(kv, pending)
                pending = [tok]
                n += 1
            if step == wl.tool_calls:
                break
            with stopwatch() as t:
                resp = sess.http_fetch(tool.url(a, step))
            timings.fetch_s.append(t[0])
            pending = pending + sess.tokenize(json.loads(resp.body)["observation"])
        sess.kv_close(kv)
        return n

    try:
        with stopwatch() as t:
            produced = sum(run_threads([lambda a=a: agent(a) for a in range(wl.agents)]))
    finally:
        ids = {sid for _, sid in sessions}
        timings.swaps += sum(s["swaps"] for s in worker.stats()["sessions"] if s["session_id"] in ids)
        for sess, sid in sessions:
            worker.end(sess, sid)
    return wl.agents / t[0], produced


def _call_tool(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())["observation"]


def baseline_side(
    base: VLLMBaseline, wl: Workload, tool: ToolServer, ps: list[list[int]], obs: list[list[list[int]]]
) -> tuple[float, int]:
    """(episodes/s, output tokens) of the lock-step client loop re-sending whole prompts."""
    prompts = [list(p) for p in ps]
    produced = 0
    with stopwatch() as t, concurrent.futures.ThreadPoolExecutor(wl.agents) as pool:
        for step in range(wl.tool_calls + 1):
            st = base.generate(prompts, wl.think_tokens)
            produced += st.output_tokens
            outs = st.outputs
            if step == wl.tool_calls:
                break
            # The client calls every agent's tool concurrently, then re-sends the grown prompts.
            list(pool.map(_call_tool, [tool.url(a, step) for a in range(wl.agents)]))
            for a in range(wl.agents):
                prompts[a] += outs[a] + obs[a][step]
    return wl.agents / t[0], produced


def serve_side(
    server: VLLMServer, wl: Workload, tool: ToolServer, ps: list[list[int]], obs: list[list[list[int]]]
) -> tuple[float, int]:
    """(episodes/s, output tokens) of one independent client loop per agent over ``vllm serve``."""

    def agent(a: int) -> int:
        client = server.client()
        prompt = list(ps[a])
        n = 0
        try:
            for step in range(wl.tool_calls + 1):
                out = client.complete(prompt, wl.think_tokens)
                n += len(out)
                if step == wl.tool_calls:
                    break
                _call_tool(tool.url(a, step))
                prompt += out + obs[a][step]
        finally:
            client.close()
        return n

    with stopwatch() as t:
        produced = sum(run_threads([lambda a=a: agent(a) for a in range(wl.agents)]))
    return wl.agents / t[0], produced


@dataclass
class Side:
    """One way of running the agents and the figures its repetitions go into."""

    run: Callable[[list[list[int]]], tuple[float, int]]
    episodes: list[Sample]
    tokens: list[Sample]


def run(
    worker: WorkerProcess,
    base: VLLMBaseline,
    cfg: BenchConfig,
    wl: Workload,
    result: BenchResult,
    server: VLLMServer | None = None,
) -> None:
    tool = ToolServer(wl.tool_latency_ms / 1000)
    obs = obs_tokens(cfg.model, wl)
    title = f"react {wl.agents} agents x {wl.tool_calls} tools"
    offline = Comparison(f"{title} vs offline loop", "ep/s")
    offline_tok = Comparison(f"{title} vs offline loop (tokens)", "tok/s")
    serve = Comparison(f"{title} vs vllm serve", "ep/s")
    serve_tok = Comparison(f"{title} vs vllm serve (tokens)", "tok/s")
    timings = Timings()
    sides = [
        Side(
            lambda p: symphony_side(worker, wl, tool, p, timings),
            [offline.symphony, serve.symphony],
            [offline_tok.symphony, serve_tok.symphony],
        ),
        Side(lambda p: baseline_side(base, wl, tool, p, obs), [offline.baseline], [offline_tok.baseline]),
    ]
    if server is not None:
        sides.append(Side(lambda p: serve_side(server, wl, tool, p, obs), [serve.baseline], [serve_tok.baseline]))
    try:
        for i in range(cfg.reps):
            repetition_starts()
            ps = [random_tokens(wl.prompt_tokens, cfg.seed, 6, i, a) for a in range(wl.agents)]
            for side in sides if i % 2 == 0 else reversed(sides):
                with stopwatch() as t:
                    rate, produced = side.run(ps)
                for sample in side.episodes:
                    sample.add(rate)
                for sample in side.tokens:
                    sample.add(produced / t[0])
    finally:
        tool.close()
    fetch = sorted(timings.fetch_s)
    common = {
        "tool_latency_ms": wl.tool_latency_ms,
        "http_fetch_ms_median": 1000 * fetch[len(fetch) // 2],
        "http_fetch_ms_max": 1000 * fetch[-1],
        "session_swaps": timings.swaps,
    }
    offline.extra.update(common, baseline_kind="offline vllm.LLM, lock-step client loop (best case for a client)")
    result.comparisons += [offline, offline_tok]
    if server is not None:
        serve.extra.update(
            common,
            target=">= 1.24x client loop over vllm serve",
            baseline_kind="vllm serve, one keep-alive HTTP client loop per agent re-sending its prompt",
        )
        result.comparisons = [serve, serve_tok, *result.comparisons]
    else:
        offline.extra["target"] = ">= 1.24x client loop over vllm serve (skipped: --serve-baseline 0)"
    result.notes.append(
        f"http_fetch wall per tool call: median {1000 * fetch[len(fetch) // 2]:.0f} ms, "
        f"max {1000 * fetch[-1]:.0f} ms (tool latency {wl.tool_latency_ms:.0f} ms)"
    )


def main(argv: list[str] | None = None) -> int:
    cfg, wl = workload_args(argv, __doc__ or NAME, Workload(), QUICK)
    opts = WorkerOptions(
        model=cfg.model,
        num_pages=wl.pages(128),
        dtype=cfg.dtype,
        max_model_len=max_len_for(wl.episode_tokens(48)),
        max_num_seqs=wl.agents,
    )

    def measure(w: WorkerProcess, b: VLLMBaseline, r: BenchResult) -> None:
        if not wl.serve_baseline:
            run(w, b, cfg, wl, r)
            return
        server = VLLMServer(
            cfg.model,
            baseline_blocks(opts),
            dtype=cfg.dtype,
            max_num_seqs=opts.max_num_seqs,
            max_model_len=opts.max_model_len,
        )
        try:
            server.wait_ready()
            run(w, b, cfg, wl, r, server)
            # The target row's baseline is the server; the offline loop is recorded beside it.
            fill_sides(r, w, server, baseline_offline=b)
        finally:
            server.close()

    run_standalone(NAME, cfg, wl, opts, measure)
    return 0


if __name__ == "__main__":
    sys.exit(main())
