"""What each side of a benchmark ran with, read from the processes that were started.

The protocol (bench/README.md) asks every record to prove that both sides had the same forward
threads, CPUs, OpenMP wait policy, dtype, maximum batch and (at least) the same KV bytes. A value
typed into the benchmark would prove nothing, so each one is read where it takes effect:

* **CPUs**: the union of ``Cpus_allowed_list`` over the threads of the process that runs the
  forward (``/proc/<pid>/task/*/status``): ``vllm serve``'s OpenMP threads are each bound to one
  core, so the process's own mask alone would understate them.
* **Forward threads**: the OpenMP thread count of that process: ``OMP_NUM_THREADS`` from the
  environment it was started with, else one per CPU it may use (libgomp's and torch's default).
* **OpenMP wait policy**: ``OMP_WAIT_POLICY`` from the environment the side was started with.
* **KV bytes**: the KV pages the running side reports (the worker's device and host pages from
  its ``stats``, vLLM's blocks from its engine or its ``/metrics``), times the bytes of one page
  of this model, dtype and block size.

Only the standard library and ``/proc``: the functions run in the benchmark process, beside the
processes they read.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

#: Bytes per element of each dtype a side may compute in.
DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "fp8": 1}


def parse_cpu_list(text: str) -> list[int]:
    """``"0-2,5"`` (the kernel's list format) as ``[0, 1, 2, 5]``."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return sorted(cpus)


def cpu_list_text(cpus: Iterable[int]) -> str:
    """The inverse of :func:`parse_cpu_list` (``[0, 1, 2, 5]`` -> ``"0-2,5"``)."""
    ranges: list[list[int]] = []
    for cpu in sorted(set(cpus)):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


def _status_field(path: Path, name: str) -> str | None:
    try:
        for line in path.read_text().splitlines():
            if line.startswith(name + ":"):
                return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def thread_cpus(pid: int, proc: Path = Path("/proc")) -> list[int]:
    """The CPUs any thread of ``pid`` may run on (the union of their affinity masks)."""
    cpus: set[int] = set()
    tasks = proc / str(pid) / "task"
    try:
        tids = [p.name for p in tasks.iterdir()]
    except OSError:
        tids = []
    for tid in tids:
        text = _status_field(tasks / tid / "status", "Cpus_allowed_list")
        if text:
            cpus.update(parse_cpu_list(text))
    if not cpus:
        text = _status_field(proc / str(pid) / "status", "Cpus_allowed_list")
        if text is None:
            raise ProcessLookupError(f"no process {pid} to read CPUs from")
        cpus.update(parse_cpu_list(text))
    return sorted(cpus)


def process_env(pid: int, proc: Path = Path("/proc")) -> dict[str, str]:
    """The environment ``pid`` was started with (``/proc/<pid>/environ``; empty if unreadable).
    A process that rewrites its title (vLLM's ``VLLM::Worker``) may overwrite the first entries."""
    try:
        raw = (proc / str(pid) / "environ").read_bytes()
    except OSError:
        return {}
    out: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key:
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


def openmp_threads(env: Mapping[str, str], cpus: list[int]) -> int:
    """The OpenMP threads a process's forward runs on: ``OMP_NUM_THREADS`` if it was started
    with one, else one per CPU it may use (what libgomp and torch then take)."""
    value = (env.get("OMP_NUM_THREADS") or "").split(",")[0].strip()
    return int(value) if value.isdigit() and int(value) > 0 else len(cpus)


def children(pid: int, proc: Path = Path("/proc")) -> list[int]:
    """Direct children of ``pid`` (from each process's ``stat``)."""
    out = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # ``pid (comm) state ppid ...``: comm may hold spaces and parentheses; split after it.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == pid:
            out.append(int(entry.name))
    return sorted(out)


def forward_process(pid: int, proc: Path = Path("/proc")) -> int:
    """The process of the tree under ``pid`` that runs the forward: the deepest descendant
    that is not a ``multiprocessing`` helper (for ``vllm serve``: API server -> EngineCore ->
    Worker, the worker). ``pid`` itself when it has no such children (the Symphony worker)."""
    best, best_depth = pid, 0
    todo = [(pid, 0)]
    while todo:
        current, depth = todo.pop()
        for child in children(current, proc):
            try:
                cmdline = (proc / str(child) / "cmdline").read_bytes()
            except OSError:
                continue
            if b"resource_tracker" in cmdline or b"semaphore_tracker" in cmdline:
                continue
            if depth + 1 > best_depth:
                best, best_depth = child, depth + 1
            todo.append((child, depth + 1))
    return best


def kv_geometry(model_dir: str) -> tuple[int, int, int]:
    """(layers, KV heads, head dim) of the model in ``model_dir``: what one token's KV holds."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    config = config.get("text_config", config)
    layers = int(config["num_hidden_layers"])
    heads = int(config.get("num_key_value_heads") or config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // int(config["num_attention_heads"]))
    return layers, heads, head_dim


def dtype_bytes(model_dir: str, dtype: str) -> int:
    """Bytes of one element in ``dtype`` (``auto``: the checkpoint's own dtype)."""
    key = dtype.removeprefix("torch.")
    if key == "auto":
        config = json.loads((Path(model_dir) / "config.json").read_text())
        config = config.get("text_config", config)
        key = str(config.get("torch_dtype") or config.get("dtype") or "float32")
    return DTYPE_BYTES[key]


def kv_page_bytes(model_dir: str, dtype: str, block_size: int) -> int:
    """Bytes of one KV page (keys and values of every layer for ``block_size`` tokens) of the
    model in ``model_dir`` computed in ``dtype``: the same on both sides for the same model."""
    layers, heads, head_dim = kv_geometry(model_dir)
    return 2 * layers * heads * head_dim * block_size * dtype_bytes(model_dir, dtype)


def side(
    *,
    pid: int,
    env: Mapping[str, str] | None,
    dtype: str,
    max_batch: int,
    kv_pages: int,
    page_bytes: int,
    forward_threads: int | None = None,
    compiled: bool | None = None,
) -> dict[str, Any]:
    """One side's entry of ``BenchResult.sides``, read from process ``pid`` (the process that
    runs the forward) and ``env`` (the environment the side was started with; ``None``: read
    ``pid``'s own). ``forward_threads``: the count the forward's own process reported (an
    in-process engine), else read from the process as :func:`openmp_threads` says.
    ``compiled``: whether its forward runs compiled (the protocol wants both sides alike)."""
    started_env = dict(env) if env is not None else process_env(pid)
    cpus = thread_cpus(pid)
    threads = forward_threads if forward_threads is not None else openmp_threads({**started_env}, cpus)
    return {
        "forward_threads": threads,
        "cpu_affinity": cpus,
        "omp_wait_policy": started_env.get("OMP_WAIT_POLICY") or "default",
        "dtype": dtype.removeprefix("torch."),
        "max_batch": max_batch,
        "kv_pages": kv_pages,
        "kv_bytes": kv_pages * page_bytes,
        "pid": pid,
        # Whether the forward ran compiled (torch.compile) or eagerly; None: not known.
        "compiled": compiled,
    }


def combined(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One side made of several processes (B12's two workers): threads, batch and KV added up,
    CPUs united; the wait policy and dtype are each part's (joined where they differ)."""
    return {
        "forward_threads": sum(int(p["forward_threads"]) for p in parts),
        "cpu_affinity": sorted({c for p in parts for c in p["cpu_affinity"]}),
        "omp_wait_policy": "/".join(sorted({str(p["omp_wait_policy"]) for p in parts})),
        "dtype": "/".join(sorted({str(p["dtype"]) for p in parts})),
        "max_batch": sum(int(p["max_batch"]) for p in parts),
        "kv_pages": sum(int(p["kv_pages"]) for p in parts),
        "kv_bytes": sum(int(p["kv_bytes"]) for p in parts),
        "parts": parts,
    }


def equal_compute_env(cpus: Iterable[int]) -> dict[str, str]:
    """Environment for ``vllm serve`` that gives its forward the CPUs ``cpus`` (one OpenMP
    thread each) with the worker's OpenMP wait policy: without it, vLLM reserves one core of
    the machine for its scheduler process and binds the forward to the rest (one core of two)."""
    return {
        "VLLM_CPU_OMP_THREADS_BIND": cpu_list_text(cpus),
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        "OMP_WAIT_POLICY": "PASSIVE",
    }


def parse_cache_config_info(metrics_text: str) -> dict[str, str]:
    """The labels of vLLM's ``vllm:cache_config_info`` gauge in a ``/metrics`` page (the engine's
    cache configuration as it started: ``num_gpu_blocks``, ``block_size``, ...)."""
    for line in metrics_text.splitlines():
        if line.startswith("vllm:cache_config_info{"):
            body = line[line.index("{") + 1 : line.rindex("}")]
            labels: dict[str, str] = {}
            for part in _split_labels(body):
                key, _, value = part.partition("=")
                labels[key.strip()] = value.strip().strip('"')
            return labels
    raise ValueError("no vllm:cache_config_info in the metrics page")


def _split_labels(body: str) -> list[str]:
    parts, current, quoted = [], "", False
    for ch in body:
        if ch == '"':
            quoted = not quoted
        if ch == "," and not quoted:
            parts.append(current)
            current = ""
        else:
            current += ch
    if current:
        parts.append(current)
    return parts
