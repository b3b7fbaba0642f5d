"""Shared benchmark harness: workloads, timing, a worker subprocess, JSON output.

Why it looks like this:

* Both sides of every ratio are measured in the same process tree, back to back, with their
  repetitions interleaved (S, B, S, B, ...), because the 2-core machines are shared and absolute
  timings drift by tens of percent within minutes. The ratio of medians is what we report.
* Workloads are generated from fixed seeds (token ids drawn from the ordinary-token range of the
  vocabulary), so a rerun measures the same thing and the baseline sees exactly the same tokens.
* The Symphony worker always runs as ``python -m gpu_worker`` in a subprocess: vLLM allows only one
  engine per process, and the benchmark process hosts the baseline (or the bare engine for B3).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import queue
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from bench import host_share

T = TypeVar("T")
R = TypeVar("R")

ROOT = Path(__file__).resolve().parent.parent
#: JSON results; ``SYMPHONY_BENCH_OUT`` redirects them (the smoke test writes to a temp dir).
OUT_DIR = Path(os.environ.get("SYMPHONY_BENCH_OUT") or ROOT / "bench" / "out")
TINY_MODEL_DIR = ROOT / "bench" / "out" / "models" / "tiny"
#: Token ids drawn for synthetic text: above the special/byte tokens, inside every vocab we use.
TOKEN_LO, TOKEN_HI = 1000, 30000
WORKER_START_TIMEOUT_S = 300.0

#: The benchmark protocol (bench/README.md, "The protocol") a record produced by this harness
#: follows; ``bench/results.py`` judges a record against it.
PROTOCOL_VERSION = 1
#: Interleaved repetitions the protocol asks for at least.
MIN_REPS = 5
#: A host is *busy* when its 1-minute load average before the run was above this share of its
#: CPUs (something else was computing), or when, during a repetition, processes that are not the
#: benchmark's (bench/host_share.py) used more than ``BUSY_OTHER_CPUS`` cores on average. Where
#: that cannot be measured (no cgroup v1 ``cpuacct``), the older rule stands: a load average
#: above CPUs + 1 at the start of a repetition.
BUSY_LOAD_BEFORE_PER_CPU = 0.5
#: Cores of other work during a repetition past which the host counts as busy (a quarter core:
#: the idle host's own daemons, PostgreSQL and Redis of other databases, stay far below it).
BUSY_OTHER_CPUS = 0.25

#: The OpenMP wait policy of both sides (the protocol's "equal compute"): the worker sets
#: ``PASSIVE`` for its own forward (gpu_worker/__main__.py); a benchmark process that hosts a
#: forward (the offline vLLM baseline, B3's engine) gets it too, set here before torch loads
#: libgomp, which reads it once at start-up. ``OMP_POLICY_SET_HERE``: whether that held.
OMP_WAIT_POLICY = "PASSIVE"
OMP_POLICY_SET_HERE = "OMP_WAIT_POLICY" not in os.environ and "libgomp" not in Path("/proc/self/maps").read_text()
if OMP_POLICY_SET_HERE:
    os.environ["OMP_WAIT_POLICY"] = OMP_WAIT_POLICY

# The LIP SDK (``import symphony``) lives in sandbox/; benchmarks run LIP code in-process.
if str(ROOT / "sandbox") not in sys.path:
    sys.path.insert(0, str(ROOT / "sandbox"))


# ------------------------------------------------------------------------------ config
@dataclass(frozen=True)
class BenchConfig:
    """What every benchmark module receives from ``python -m bench``."""

    model: str
    quick: bool = False
    reps: int = MIN_REPS
    #: Same dtype on both sides; float32 because bf16 is emulated (slow) on these CPUs.
    dtype: str = "float32"
    seed: int = 0


def default_model(quick: bool) -> str:
    """``--quick`` runs on the tiny random Llama (real tokenizer): it checks the harness, not
    the model; the full mode uses the default SmolLM2-135M-Instruct directory."""
    if quick:
        return str(ensure_tiny_model())
    from gpu_worker.model_store import default_model_dir

    return str(default_model_dir())


def ensure_tiny_model() -> Path:
    if not (TINY_MODEL_DIR / "config.json").exists():
        from gpu_worker.model_store import default_model_dir, write_tiny_model

        TINY_MODEL_DIR.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix="tiny-", dir=TINY_MODEL_DIR.parent))
        write_tiny_model(tmp, default_model_dir())
        if not (TINY_MODEL_DIR / "config.json").exists():
            os.replace(tmp, TINY_MODEL_DIR)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return TINY_MODEL_DIR


# --------------------------------------------------------------------------- workloads
def rng(seed: int, *salt: int) -> np.random.Generator:
    """A generator per (seed, salt...), so adding a workload never shifts another's tokens."""
    return np.random.default_rng([seed, *salt])


def random_tokens(n: int, seed: int, *salt: int) -> list[int]:
    return rng(seed, *salt).integers(TOKEN_LO, TOKEN_HI, size=n).tolist()


def pareto_popularity(n_docs: int, alpha: float) -> np.ndarray:
    """Probability of each document rank: ``p_k ∝ k^-alpha`` (discrete Pareto / Zipf law).

    alpha 0.5 is nearly flat (little reuse), alpha 3 puts ~83% of requests on the top doc.
    """
    weights = np.arange(1, n_docs + 1, dtype=np.float64) ** -alpha
    return weights / weights.sum()


def pareto_trace(n_docs: int, n_requests: int, alpha: float, seed: int, part: int = 0) -> list[int]:
    """Document index per request, drawn i.i.d. from :func:`pareto_popularity`.

    Ranks are mapped to document ids by a fixed permutation so "hot" is not "first created".
    ``part`` picks another stretch of the same request stream (same ranking, fresh draws): a
    benchmark's repetitions each take their own, so no side replays the exact requests it has
    just served, which would let a cache that holds one stretch look like it holds the stream.
    """
    perm = _doc_ranking(n_docs, alpha, seed)
    ranks = rng(seed, int(alpha * 1000), n_docs, part).choice(
        n_docs, size=n_requests, p=pareto_popularity(n_docs, alpha)
    )
    return [int(perm[k]) for k in ranks]


def _doc_ranking(n_docs: int, alpha: float, seed: int) -> np.ndarray:
    """Document ids from most to least popular."""
    return rng(seed, int(alpha * 1000), n_docs).permutation(n_docs)


# ------------------------------------------------------------------------------ timing
@dataclass
class Sample:
    """Repeated measurements of one quantity (seconds or a rate), summarised by the median."""

    values: list[float] = field(default_factory=list)

    def add(self, v: float) -> None:
        self.values.append(float(v))

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else float("nan")

    def to_dict(self) -> dict[str, Any]:
        return {"median": self.median, "values": self.values}


@dataclass
class Comparison:
    """One figure measured on both sides; ``ratio`` = Symphony ÷ baseline of the medians.

    ``higher_is_better`` says how to read it (throughputs: True; latencies: False).
    """

    name: str
    unit: str
    symphony: Sample = field(default_factory=Sample)
    baseline: Sample = field(default_factory=Sample)
    higher_is_better: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        b = self.baseline.median
        return self.symphony.median / b if b else float("nan")

    @property
    def paired_ratios(self) -> list[float]:
        """Symphony ÷ baseline of each repetition's pair (the two sides measured back to back),
        which cancels the drift between repetitions that a ratio of medians keeps."""
        pairs = zip(self.symphony.values, self.baseline.values, strict=False)
        return [s / b for s, b in pairs if b]

    def to_dict(self) -> dict[str, Any]:
        paired = self.paired_ratios
        return {
            **self.extra,  # first: a benchmark's extra keys never shadow the measured fields
            "name": self.name,
            "unit": self.unit,
            "symphony": self.symphony.to_dict(),
            "baseline": self.baseline.to_dict(),
            "ratio": self.ratio,
            "paired_ratio": {
                "median": statistics.median(paired) if paired else float("nan"),
                "min": min(paired, default=float("nan")),
                "max": max(paired, default=float("nan")),
                "values": paired,
            },
            "higher_is_better": self.higher_is_better,
        }

    def line(self) -> str:
        return (
            f"{self.name:<34} symphony {self.symphony.median:10.3f} {self.unit:<8} "
            f"baseline {self.baseline.median:10.3f} {self.unit:<8} ratio {self.ratio:6.3f}"
        )


#: The host's 1-minute load average at the start of each repetition of this process's run,
#: written into the record (``BenchResult.protocol``).
LOAD_PER_REP: list[float] = []
#: The load average when this process started, before either side did anything.
LOAD_BEFORE = os.getloadavg()[0]
#: This benchmark's processes as one accounting group, and a CPU reading at the start of each
#: repetition (``protocol.cpu_per_rep``: one entry per repetition, from its start to the next's).
HOST_SHARE = host_share.HostShare()
CPU_READINGS: list[host_share.CpuReading] = []


def repetition_starts() -> None:
    """Note the host's 1-minute load average and a CPU reading as a timed repetition starts (the
    record's ``protocol.load_per_rep`` and ``cpu_per_rep``); every benchmark's repetition loop
    calls it first. The first call puts the benchmark and both sides, already started, in their
    accounting group (bench/host_share.py)."""
    LOAD_PER_REP.append(os.getloadavg()[0])
    if HOST_SHARE.track():
        reading = HOST_SHARE.read()
        if reading is not None:
            CPU_READINGS.append(reading)


def cpu_per_rep() -> list[dict[str, float]] | None:
    """Each repetition's CPU split (own, containers, other), the last one up to now; ``None``
    where it cannot be measured."""
    now = HOST_SHARE.read()
    if now is None or not CPU_READINGS:
        return None
    marks = [*CPU_READINGS, now]
    return [host_share.between(a, b) for a, b in itertools.pairwise(marks)]


def interleaved(reps: int, symphony: Callable[[], float], baseline: Callable[[], float], cmp: Comparison) -> None:
    """Run the two sides alternately ``reps`` times, recording into ``cmp`` (why: drift), and
    the host's load average at the start of each repetition."""
    for i in range(reps):
        repetition_starts()
        # Alternate which side goes first so a slow-down during one rep hits both evenly.
        order = [(symphony, cmp.symphony), (baseline, cmp.baseline)]
        for fn, sample in order if i % 2 == 0 else reversed(order):
            sample.add(fn())


@contextlib.contextmanager
def stopwatch() -> Iterator[list[float]]:
    """``with stopwatch() as t: ...`` then ``t[0]`` is the elapsed wall time in seconds."""
    out: list[float] = []
    start = time.perf_counter()
    try:
        yield out
    finally:
        out.append(time.perf_counter() - start)


# ------------------------------------------------------------------------------ output
@dataclass
class BenchResult:
    """What one benchmark run writes to ``bench/out/<name>.json`` and prints."""

    name: str
    config: dict[str, Any]
    comparisons: list[Comparison] = field(default_factory=list)
    memory: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    started: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    wall_s: float = 0.0
    #: What each side ran with, as the protocol asks the record to prove: ``{"symphony": {...},
    #: "baseline": {...}}`` with ``forward_threads``, ``cpu_affinity``, ``omp_wait_policy``,
    #: ``dtype``, ``max_batch`` and ``kv_bytes`` each, read from the running sides
    #: (:func:`fill_sides`, :mod:`bench.resources`).
    sides: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "config": self.config,
            "started": self.started,
            "wall_s": self.wall_s,
            "machine": machine(),
            "code": CODE_AT_START,
            "command": command(),
            "protocol": self.protocol(),
            "comparisons": [c.to_dict() for c in self.comparisons],
            "memory": self.memory,
            "notes": self.notes,
        }

    def protocol(self) -> dict[str, Any]:
        """The protocol's evidence: version, both sides' resources, the host's load."""
        cpus = os.cpu_count() or 1
        per_rep = cpu_per_rep()
        if per_rep is None:
            during = any(load > cpus + 1 for load in LOAD_PER_REP)
        else:
            during = any(rep["other_cpus"] > BUSY_OTHER_CPUS for rep in per_rep)
        return {
            "version": PROTOCOL_VERSION,
            "sides": self.sides,
            "load_before": LOAD_BEFORE,
            "load_per_rep": list(LOAD_PER_REP),
            "cpu_per_rep": per_rep,
            "busy": LOAD_BEFORE > BUSY_LOAD_BEFORE_PER_CPU * cpus or during,
            "busy_bound": {
                "before_per_cpu": BUSY_LOAD_BEFORE_PER_CPU,
                **({"per_rep": cpus + 1} if per_rep is None else {"other_cpus": BUSY_OTHER_CPUS}),
            },
        }

    def write(self) -> Path:
        OUT_DIR.mkdir(parents=True, exist_ok=True)
        path = OUT_DIR / f"{self.name}.json"
        path.write_text(json.dumps(self.to_dict(), indent=2, default=str))
        return path

    def print(self) -> None:
        print(f"== {self.name} ({self.wall_s:.1f}s)", flush=True)
        for c in self.comparisons:
            print("  " + c.line(), flush=True)
        for k, v in self.memory.items():
            print(f"  memory {k}: {v}", flush=True)
        for n in self.notes:
            print(f"  note: {n}", flush=True)


def command() -> str:
    """The command line of this benchmark process, as it would be typed again."""
    import shlex

    return f"python -m bench.{Path(sys.argv[0]).stem} {shlex.join(sys.argv[1:])}".strip()


def code_version() -> dict[str, Any]:
    """The commit the run measured, and whether tracked files other than the records differed
    from it (a record of a dirty tree says so: its code is not in the history)."""

    def git(*args: str) -> str:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30)
        return out.stdout.strip() if out.returncode == 0 else ""

    commit = git("rev-parse", "HEAD")
    if not commit:
        return {"commit": None, "dirty": None}
    # The records and their table are the runs' output, not code: a run after another that
    # left its record uncommitted measured the same code.
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!bench/results", ":!bench/RESULTS.md")
    return {"commit": commit, "dirty": bool(changed)}


#: The code this benchmark process measures, read as it starts (a commit made while it runs is
#: not what it measured).
CODE_AT_START = code_version()


def machine() -> dict[str, Any]:
    import platform

    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cpus": os.cpu_count(), "platform": platform.platform(), "gpu": gpu, "torch": torch.__version__}


def this_process_env() -> dict[str, str]:
    """The OpenMP-relevant environment this process's forward runs under: what it was started
    with, plus the wait policy this module set before any OpenMP runtime was loaded."""
    from bench.resources import process_env

    env = process_env(os.getpid())
    if OMP_POLICY_SET_HERE:
        env["OMP_WAIT_POLICY"] = os.environ["OMP_WAIT_POLICY"]
    return env


def fill_sides(result: BenchResult, symphony: Any, baseline: Any, **more: Any) -> None:
    """``result.sides`` from each side's :meth:`resources` (read from its running processes),
    taken while both still run; ``more``: further baselines of the benchmark, by name."""
    result.sides = {"symphony": symphony.resources(), "baseline": baseline.resources()}
    for name, other in more.items():
        result.sides[name] = other.resources()


def rss_mb(pid: int, field_name: str = "VmHWM") -> float:
    """Resident set size of ``pid`` in MiB (``VmHWM`` = peak, ``VmRSS`` = now)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


# ------------------------------------------------------------------------ worker process
@dataclass(frozen=True)
class WorkerOptions:
    """Flags of the ``python -m gpu_worker`` subprocess (same KV budget as the baseline)."""

    model: str
    num_pages: int
    dtype: str = "float32"
    max_model_len: int = 2048
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    #: Host-tier pages (the worker's ``--host-pages``). On a CPU host they are the same DRAM the
    #: baseline could hold KV in, so the protocol gives the baseline device + host pages
    #: (:func:`baseline_blocks`); none unless a benchmark's workload needs a host tier.
    host_pages: int = 0
    max_batch_wait_ms: float = 50.0
    #: The device pool's share no one account may hold (the worker's ``--kv-account-reserve``):
    #: none here, since the baseline is a single-tenant server given the same pool, and the
    #: benchmarks size that pool to their workload.
    kv_account_reserve: float = 0.0
    #: The worker's ``--name``: its heartbeat key and the worker its runs record (a benchmark
    #: that routes between workers gives each its own).
    name: str = "bench"
    #: Environment of this worker alone, over the benchmark's (B12 routing: its Redis database
    #: and forward threads), as ``(key, value)`` pairs.
    env: tuple[tuple[str, str], ...] = ()
    #: Per-run traces (the worker's ``--trace``): B3 measures what they cost with a worker of
    #: each (``--trace both``).
    trace: bool = True
    #: The share of the device pool pinned files may hold (the worker's ``--kv-pinned-fraction``);
    #: ``None`` keeps the worker's default. B1 pins most of its pool: one tenant, whose pin budget
    #: is the workload's retention policy, sized beside the pages its requests in flight need.
    kv_pinned_fraction: float | None = None


def log_tail(path: Path, n: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def wait_until_healthy(
    what: str, proc: subprocess.Popen, healthy: Callable[[], bool], timeout_s: float, log_path: Path
) -> None:
    """Poll ``healthy()`` (errors count as "not yet") until it holds; fail with the process's
    log tail if it exits first or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{log_tail(log_path)}")
        with contextlib.suppress(Exception):
            if healthy():
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not healthy after {timeout_s}s:\n{log_tail(log_path)}")
        time.sleep(0.25)


#: The worker gets SIGTERM when the benchmark process that started it dies (util-linux
#: ``setpriv``, where installed): a benchmark killed mid-run would otherwise leave an idle worker
#: running, taking CPU from every later measurement on the machine.
_EXIT_WITH_PARENT = ("setpriv", "--pdeathsig", "TERM", "--") if shutil.which("setpriv") else ()


class WorkerProcess:
    """A worker subprocess with its admin client; sessions yield SDK ``Session`` objects."""

    def __init__(self, opts: WorkerOptions) -> None:
        from gpu_worker.admin_client import AdminClient

        self.opts = opts
        # Unix socket paths are limited to 108 bytes: keep them under a short /tmp dir.
        self.base = Path(tempfile.mkdtemp(prefix="symb-", dir="/tmp"))
        self.admin_socket = str(self.base / "admin.sock")
        self.log_path = self.base / "worker.log"
        cmd = [
            *_EXIT_WITH_PARENT,
            sys.executable,
            "-m",
            "gpu_worker",
            "--model",
            opts.model,
            "--admin-socket",
            self.admin_socket,
            "--sessions-dir",
            str(self.base / "s"),
            "--kv-store",
            str(self.base / "kv"),
            "--num-pages",
            str(opts.num_pages),
            "--dtype",
            opts.dtype,
            "--max-model-len",
            str(opts.max_model_len),
            "--max-num-seqs",
            str(opts.max_num_seqs),
            "--max-num-batched-tokens",
            str(opts.max_num_batched_tokens),
            "--host-pages",
            str(opts.host_pages),
            "--kv-account-reserve",
            str(opts.kv_account_reserve),
            "--max-batch-wait-ms",
            str(opts.max_batch_wait_ms),
            *(["--kv-pinned-fraction", str(opts.kv_pinned_fraction)] if opts.kv_pinned_fraction is not None else []),
            "--name",
            opts.name,
            "--trace",
            "on" if opts.trace else "off",
            "--log-level",
            "WARNING",
        ]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "sandbox")]),
            "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", OMP_WAIT_POLICY),
            **dict(opts.env),
        }
        #: The environment the worker was started with (its side of the record reads it).
        self.env = env
        with open(self.log_path, "wb") as fh:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT)
        self.admin = AdminClient(self.admin_socket, timeout=120)
        self._sessions: list[str] = []
        self._peak_pages = 0
        self._sampling = False

    def wait_ready(self) -> None:
        def healthy() -> bool:
            return os.path.exists(self.admin_socket) and bool(self.admin.health().get("ok"))

        wait_until_healthy("worker", self.proc, healthy, WORKER_START_TIMEOUT_S, self.log_path)

    def log_tail(self, n: int = 4000) -> str:
        return log_tail(self.log_path, n)

    def connect(self, tenant: str, limits: dict[str, Any] | None = None) -> Any:
        """A new session of ``tenant`` and an SDK ``Session`` connected to it."""
        import symphony

        info = self.admin.create_session(tenant, f"bench-{uuid.uuid4().hex[:8]}", limits or {})
        self._sessions.append(info.session_id)
        return symphony.connect(info.socket_path, info.token), info.session_id

    def end(self, session: Any, session_id: str) -> dict[str, Any]:
        with contextlib.suppress(Exception):
            session.close()
        if session_id in self._sessions:
            self._sessions.remove(session_id)
        return self.admin.end_session(session_id).usage

    def stats(self) -> dict[str, Any]:
        return self.admin.stats()

    @contextlib.contextmanager
    def sample_pages(self, period_s: float = 0.1) -> Iterator[None]:
        """Track the peak of device KV pages in use while the block runs (admin ``health``)."""
        stop = threading.Event()

        def loop() -> None:
            while not stop.is_set():
                with contextlib.suppress(Exception):
                    h = self.admin.health()
                    self._peak_pages = max(self._peak_pages, h["pages_total"] - h["pages_free"])
                stop.wait(period_s)

        t = threading.Thread(target=loop, daemon=True)
        t.start()
        try:
            yield
        finally:
            stop.set()
            t.join()

    def resources(self) -> dict[str, Any]:
        """This side's entry of the record's ``protocol.sides``, read from the running worker:
        its CPUs and OpenMP settings from ``/proc``, its KV pages (device + host tier) from its
        ``stats``, its dtype and block size from its ``health``."""
        from bench.resources import kv_page_bytes, side

        health, kvfs = self.admin.health(), self.stats()["kvfs"]
        pages = int(kvfs["total_pages"]) + int(kvfs.get("host_capacity_pages") or 0)
        return {
            **side(
                pid=self.proc.pid,
                env=self.env,
                dtype=str(health["dtype"]),
                max_batch=self.opts.max_num_seqs,
                kv_pages=pages,
                page_bytes=kv_page_bytes(self.opts.model, str(health["dtype"]), int(health["block_size"])),
                compiled=health.get("compiled"),
            ),
            "device_pages": int(kvfs["total_pages"]),
            "host_pages": int(kvfs.get("host_capacity_pages") or 0),
        }

    def memory(self) -> dict[str, Any]:
        """Peak worker RSS and device pages (page 0 is reserved, so ``pages_total - 1`` usable)."""
        st = self.stats()
        return {
            "worker_peak_rss_mb": round(rss_mb(self.proc.pid), 1),
            "worker_rss_mb": round(rss_mb(self.proc.pid, "VmRSS"), 1),
            "device_pages_total": st["kvfs"]["total_pages"],
            "device_pages_peak_used": self._peak_pages,
            "host_pages_now": st["kvfs"]["host_pages"],
            "disk_pages_now": st["kvfs"]["disk_pages"],
            "scheduler": {
                k: st["scheduler"].get(k)
                for k in (
                    "forwards",
                    "avg_items_per_forward",
                    "batch_occupancy",
                    "forward_ms_avg",
                    "forward_ms_max",
                    "queue_wait_ms_avg",
                    "queue_wait_ms_max",
                    "queue_wait_ms_max_decode",
                    "gap_ms_avg",
                    "plan_ms_avg",
                    "results_ms_avg",
                    # The engine's wall time over the worker's life (warm-up and the baseline's
                    # turns included): busy, idle with a call queued, idle with nothing to run.
                    # ``EngineTime`` gives the same for the measured stretches alone.
                    "busy_s",
                    "idle_with_work_queued_s",
                    "idle_empty_s",
                    "batch_wait_s",
                    "busy_fraction",
                    "idle_with_work_fraction",
                    "idle_with_work_share_of_loaded",
                    "launch_reasons",
                    "forwards_seq_capped",
                    "forwards_token_capped",
                    "passed_over_per_tenant",
                )
            },
        }

    def engine_time(self) -> dict[str, float]:
        """The scheduler's cumulative engine-time buckets (see ``EngineTime``)."""
        st = self.stats()["scheduler"]
        return {k: float(st.get(k) or 0.0) for k in ENGINE_TIME_KEYS}

    def close(self) -> None:
        for sid in list(self._sessions):
            with contextlib.suppress(Exception):
                self.admin.end_session(sid)
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> WorkerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


ENGINE_TIME_KEYS = ("busy_s", "idle_with_work_queued_s", "idle_empty_s", "batch_wait_s", "forwards")


class EngineTime:
    """The worker engine's busy fraction over the measured stretches of one figure only.

    The scheduler's ``stats`` count busy / idle-with-work-queued / idle-empty seconds over the
    worker's life; a figure's share needs the difference across the stretches it timed (not the
    baseline's turns, not set-up). ``idle_with_work_fraction`` is the per-token tax under load:
    the engine idle while a call could have run, as a share of the stretch's wall time."""

    def __init__(self, worker: WorkerProcess) -> None:
        self.worker = worker
        self.sums = dict.fromkeys(ENGINE_TIME_KEYS, 0.0)

    @contextlib.contextmanager
    def measure(self) -> Iterator[None]:
        before = self.worker.engine_time()
        yield
        after = self.worker.engine_time()
        for k in ENGINE_TIME_KEYS:
            self.sums[k] += after[k] - before[k]

    def to_dict(self) -> dict[str, float]:
        s = self.sums
        wall = s["busy_s"] + s["idle_with_work_queued_s"] + s["idle_empty_s"]
        out = {k: round(v, 3) for k, v in s.items()}
        if wall > 0:
            out["busy_fraction"] = round(s["busy_s"] / wall, 4)
            out["idle_with_work_fraction"] = round(s["idle_with_work_queued_s"] / wall, 4)
            out["idle_empty_fraction"] = round(s["idle_empty_s"] / wall, 4)
            out["batch_wait_fraction"] = round(s["batch_wait_s"] / wall, 4)
        return out

    def line(self) -> str:
        d = self.to_dict()
        if "busy_fraction" not in d:
            return "engine: no time measured"
        wall = d["busy_s"] + d["idle_with_work_queued_s"] + d["idle_empty_s"]
        return (
            f"engine busy {100 * d['busy_fraction']:.1f}%, idle with work queued "
            f"{100 * d['idle_with_work_fraction']:.1f}% (batch wait {100 * d['batch_wait_fraction']:.1f}%), "
            f"idle empty {100 * d['idle_empty_fraction']:.1f}% of {wall:.1f} s"
        )


def run_threads(fns: Sequence[Callable[[], Any]]) -> list[Any]:
    """Run callables on one thread each and return their results (re-raising the first error)."""
    results: list[Any] = [None] * len(fns)
    errors: list[BaseException] = []

    def wrap(i: int, fn: Callable[[], Any]) -> None:
        try:
            results[i] = fn()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=wrap, args=(i, fn), daemon=True) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def share_out(items: Sequence[T], workers: int, handle: Callable[[int, T], R]) -> list[R]:
    """Serve ``items`` from one shared queue with ``workers`` threads; thread ``k`` calls
    ``handle(k, item)`` for each item it takes (so it can use its own session). Returns the
    results in the items' order. Why a queue and not a fixed split: a worker that finishes early
    takes the next item, which is how a client pool with ``workers`` requests in flight behaves."""
    todo: queue.Queue[int] = queue.Queue()
    for i in range(len(items)):
        todo.put(i)
    results: list[Any] = [None] * len(items)

    def worker(k: int) -> None:
        while True:
            try:
                i = todo.get_nowait()
            except queue.Empty:
                return
            results[i] = handle(k, items[i])

    run_threads([lambda k=k: worker(k) for k in range(workers)])
    return results


def common_args(argv: list[str] | None, description: str) -> BenchConfig:
    """Parse the flags every benchmark module accepts (``python -m bench.bX ...``)."""
    import argparse

    p = argparse.ArgumentParser(description=description)
    p.add_argument("--model", default=None)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--reps", type=int, default=MIN_REPS)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    return BenchConfig(model=a.model or default_model(a.quick), quick=a.quick, reps=a.reps, dtype=a.dtype, seed=a.seed)


def config_dict(cfg: BenchConfig, **workload: Any) -> dict[str, Any]:
    """The record's ``config``: the run's settings, with the model as :func:`portable_path`."""
    return {**asdict(cfg), "model": portable_path(cfg.model), **workload}


def portable_path(value: str) -> str:
    """A path as a record keeps it: relative to the checkout when inside it, else its last two
    parts (``models/<name>``). Where a directory lay on one machine says nothing to a reader of
    the record, and names that machine's layout."""
    path = Path(value)
    if not path.is_absolute():
        return value
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(Path(*path.parts[-2:]))


def workload_args(argv: list[str] | None, description: str, full: Any, quick: Any) -> tuple[BenchConfig, Any]:
    """Common flags plus one ``--field`` per int/float field of the ``Workload`` dataclass
    (``full``/``quick`` are its two presets), so each benchmark module declares sizes once."""
    import argparse
    from dataclasses import fields, replace

    p = argparse.ArgumentParser(description=description)
    p.add_argument("--model", default=None)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--reps", type=int, default=MIN_REPS)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--seed", type=int, default=0)
    sizes = [f for f in fields(full) if isinstance(getattr(full, f.name), int | float)]
    for f in sizes:
        p.add_argument("--" + f.name.replace("_", "-"), type=type(getattr(full, f.name)), default=None)
    a = p.parse_args(argv)
    changes = {f.name: getattr(a, f.name) for f in sizes if getattr(a, f.name) is not None}
    wl = replace(quick if a.quick else full, **changes)
    cfg = BenchConfig(model=a.model or default_model(a.quick), quick=a.quick, reps=a.reps, dtype=a.dtype, seed=a.seed)
    return cfg, wl


def run_standalone(
    name: str,
    cfg: BenchConfig,
    workload: Any,
    opts: WorkerOptions,
    measure: Callable[[WorkerProcess, Any, BenchResult], None],
    **baseline_kwargs: Any,
) -> BenchResult:
    """One benchmark in its own process: a worker subprocess and an in-process vLLM baseline
    with the same page budget, dtype, max batch and max length; ``measure(worker, base, result)``
    fills ``result``; memory figures are added, the JSON written and printed."""
    from bench.baseline_vllm import VLLMBaseline

    started = time.perf_counter()
    result = BenchResult(name, config_dict(cfg, **asdict(workload), device_pages=opts.num_pages))
    worker = WorkerProcess(opts)
    try:
        base = VLLMBaseline(
            cfg.model,
            baseline_blocks(opts),
            dtype=cfg.dtype,
            max_num_seqs=opts.max_num_seqs,
            max_model_len=opts.max_model_len,
            **baseline_kwargs,
        )
        worker.wait_ready()
        with worker.sample_pages():
            measure(worker, base, result)
        if not result.sides:  # a benchmark whose target baseline is another (B6) filled them
            fill_sides(result, worker, base)
        result.memory = worker.memory()
        base.close()
    finally:
        worker.close()
    result.wall_s = time.perf_counter() - started
    result.print()
    print(f"  wrote {result.write()}")
    return result


def baseline_blocks(opts: WorkerOptions) -> int:
    """The baseline's KV blocks under the protocol's equal KV bytes: the worker's device pages
    plus the host-tier pages it may use (on a CPU host the same DRAM; on a GPU, size vLLM's CPU
    offload like the host tier instead)."""
    return opts.num_pages + opts.host_pages


def max_len_for(tokens: int, block_size: int = 128) -> int:
    """``max_model_len`` for sequences of ``tokens`` tokens: whole blocks, at least 512."""
    return max(512, -(-(tokens + 8) // block_size) * block_size)
