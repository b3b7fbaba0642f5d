# ruff: noqa: RUF001, RUF002 -- the page is typographic markdown (multiplication sign, alpha, en dash).
"""``bench/RESULTS.md``: one table per benchmark, generated from one record per benchmark.

A record is the JSON a benchmark run writes (``harness.BenchResult.to_dict``: config, started,
machine, command, comparisons with both sides' repetitions, memory, notes). ``python -m bench
<b>`` in full mode copies the run's ``bench/out/<name>.json`` to ``bench/results/<name>.json``,
which is committed (``bench/out/`` is not), and regenerates RESULTS.md from every record;
``python -m bench results`` regenerates it without running anything. So the table always shows
each benchmark's latest full-mode run, and how it was investigated lives in ``bench/NOTES.md``.

Why targets are judged here and not in the benchmark modules: a record is data (what was
measured); the target and the rule that reads the record against it are one table below, so a
changed target re-judges every record without re-running a benchmark.

Only the standard library: the generator runs where vLLM and torch are not installed.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RECORDS_DIR = ROOT / "bench" / "results"
RESULTS_MD = ROOT / "bench" / "RESULTS.md"

Record = Mapping[str, Any]
Row = Mapping[str, Any]  # one entry of a record's "comparisons"


@dataclass(frozen=True)
class Verdict:
    """A row judged against its target: ``met`` is None where the row has no target."""

    target: str
    met: bool | None
    detail: str = ""

    def cell(self) -> str:
        word = "—" if self.met is None else ("met" if self.met else "**missed**")
        return f"{word} ({self.detail})" if self.detail else word


def median(row: Row, side: str) -> float:
    """The side's median: recomputed from its repetitions where the record has them."""
    values = row[side].get("values") or []
    return statistics.median(values) if values else float(row[side]["median"])


def ratio(row: Row) -> float:
    """Symphony ÷ baseline of the medians (what every benchmark reports)."""
    base = median(row, "baseline")
    return median(row, "symphony") / base if base else float("nan")


# ------------------------------------------------------------------------------ protocol
#: The protocol version this generator judges against (``bench.harness.PROTOCOL_VERSION``).
PROTOCOL_VERSION = 1
MIN_REPS = 5
#: What each side's entry of a record's ``protocol.sides`` must say.
SIDE_KEYS = ("forward_threads", "cpu_affinity", "omp_wait_policy", "dtype", "max_batch", "kv_bytes")
#: Resources both sides must have alike (KV bytes are compared on their own: the baseline may
#: hold more, never less).
EQUAL_KEYS = ("forward_threads", "omp_wait_policy", "dtype", "max_batch")


def protocol_problems(record: Record) -> list[str]:
    """Why ``record`` does not show a run under the protocol (bench/README.md); none if it does."""
    protocol = record.get("protocol")
    if not isinstance(protocol, Mapping) or int(protocol.get("version") or 0) < PROTOCOL_VERSION:
        return ["not produced under the benchmark protocol"]
    problems = []
    reps = record.get("config", {}).get("reps")
    if not isinstance(reps, int) or reps < MIN_REPS:
        problems.append(f"{reps} repetitions (at least {MIN_REPS})")
    sides = protocol.get("sides") or {}
    missing = [
        f"{side}.{key}" for side in ("symphony", "baseline") for key in SIDE_KEYS if key not in sides.get(side, {})
    ]
    if missing:
        return [*problems, "resources not recorded: " + ", ".join(missing)]
    ours, theirs = sides["symphony"], sides["baseline"]
    problems += [f"unequal {key}: {ours[key]} vs {theirs[key]}" for key in EQUAL_KEYS if ours[key] != theirs[key]]
    if len(ours["cpu_affinity"]) != len(theirs["cpu_affinity"]):
        problems.append(f"unequal CPUs: {len(ours['cpu_affinity'])} vs {len(theirs['cpu_affinity'])}")
    # Recorded since the forward could run compiled: an older record does not say.
    compiled = (ours.get("compiled"), theirs.get("compiled"))
    if None not in compiled and compiled[0] != compiled[1]:
        problems.append(f"unequal compiled: {ours['compiled']} vs {theirs['compiled']}")
    if int(theirs["kv_bytes"]) < int(ours["kv_bytes"]):
        problems.append(f"the baseline had less KV memory: {theirs['kv_bytes']} vs {ours['kv_bytes']} bytes")
    return problems


def protocol_cell(record: Record) -> str:
    """How the record stands against the protocol, in a few words."""
    problems = protocol_problems(record)
    if problems:
        return "not under the protocol"
    busy = " (busy host)" if record["protocol"].get("busy") else ""
    return f"protocol {record['protocol']['version']}{busy}"


# ------------------------------------------------------------------------------ targets
def _b1(row: Row, record: Record) -> Verdict:
    if "alpha" not in row:
        return Verdict("—", None)
    r = ratio(row)
    target = "≥ 7× where skew matters, ≥ 1× at every α"
    if r >= 7.0:
        return Verdict(target, True)
    return Verdict(target, False, "7× missed, ≥ 1× met" if r >= 1.0 else "below 1×")


def _at_least(target: float, text: str) -> Callable[[Row, Record], Verdict]:
    def judge(row: Row, record: Record) -> Verdict:
        return Verdict(text, ratio(row) >= target)

    return judge


def _b2(row: Row, record: Record) -> Verdict:
    return Verdict("≥ 0.97× vLLM tok/s", ratio(row) >= 0.97)


#: B3's trace target: what per-run tracing may add to a decode step.
B3_TRACE_TARGET = "tracing ≤ 1% of the round trip"


def b3_trace_share(row: Row, record: Record) -> float | None:
    """The share of an untraced decode step that tracing adds, from what the record measured
    directly: the worker's CPU time per ``pred`` on its span (``memory.trace_call_us``, the
    larger of kept and bucketed) times the step's ``pred`` calls (one per sequence of the
    batch), over the untraced worker's median step. ``None`` where the record lacks it."""
    cost = (record.get("memory") or {}).get("trace_call_us") or {}
    per_call_us = max(cost.get("spans_kept_us", 0.0), cost.get("bucketed_us", 0.0))
    step_ms = median(row, "baseline")
    if not per_call_us or not step_ms:
        return None
    batch = int(row["name"].split("batch ")[1].split(",")[0])
    return per_call_us * batch / (step_ms * 1000)


def measured_trace_verdict(row: Row, target: str, share: float | None, of_what: str) -> Verdict:
    """A "tracing on vs off" row (B3, B11): two stacks differ by several percent from one
    repetition to the next on a shared host, so their ratio cannot show 1%: the verdict is the
    span work measured directly (``share``), provided the A/B does not contradict it (some
    repetition within 1% of off, in the row's direction). ``None``: an older record without the
    direct measure, judged on the A/B alone."""
    higher = bool(row.get("higher_is_better", True))
    paired = row.get("paired_ratio") or {}
    closest = float(paired.get("max" if higher else "min", ratio(row)))

    def within(r: float) -> bool:
        return r >= 0.99 if higher else r <= 1.01

    if share is None:
        return Verdict(target, within(ratio(row)))
    detail = f"span work {100 * share:.3f}% {of_what}, measured directly; the A/B cannot resolve 1%"
    if not within(closest):
        detail += f", and no repetition came within it ({closest:.2f}×)"
    return Verdict(target, share <= 0.01 and within(closest), detail)


def _b3(row: Row, record: Record) -> Verdict:
    if "tracing on vs off" in row["name"]:  # ``--trace both``: the two workers, not the engine
        return measured_trace_verdict(row, B3_TRACE_TARGET, b3_trace_share(row, record), "of a step")
    batch = int(row["name"].split("batch ")[1].split(",")[0])
    if batch < 8:
        return Verdict("≤ 5% at batch ≥ 8", None, "batch < 8: no target")
    return Verdict("≤ 5% at batch ≥ 8", ratio(row) <= 1.05)


def _b5(row: Row, record: Record) -> Verdict:
    valid = [row.get(k) for k in ("symphony_schema_valid", "baseline_schema_valid") if k in row]
    speed = ratio(row) >= 0.9
    if valid:
        ok = all(v == 1.0 for v in valid)
        return Verdict("100% schema-valid, ≥ 0.9×", speed and ok, f"{min(valid):.0%} valid")
    return Verdict("≥ 0.9×", speed)


def _b6(row: Row, record: Record) -> Verdict:
    if "vllm serve" in row["name"] and row["unit"] == "ep/s":
        return Verdict("≥ 1.24× vs a client loop over `vllm serve`", ratio(row) >= 1.24)
    return Verdict("— (a stronger baseline, no target)", None)


def _b7(row: Row, record: Record) -> Verdict:
    occupancy = [float(x) for x in row.get("batch_occupancy") or []]
    worst = row.get("worst_share_deviation")
    if not occupancy or worst is None:
        return Verdict("occupancy ≥ 90%; shares within 10% of max-min fair", None, "not measured")
    occ_ok, share_ok = min(occupancy) >= 0.9, float(worst) <= 0.10
    detail = (
        f"occupancy {_pct(min(occupancy))}–{_pct(max(occupancy))} {'met' if occ_ok else 'missed'}; "
        f"worst share {_pct(float(worst))} off {'met' if share_ok else 'missed'}"
    )
    return Verdict("occupancy ≥ 90%; shares within 10% of max-min fair", occ_ok and share_ok, detail)


def _b8(row: Row, record: Record) -> Verdict:
    warm, cold = median(row, "symphony"), median(row, "baseline")
    return Verdict("p50 cold ≤ 0.5 s, warm ≤ 50 ms", cold <= 0.5 and warm <= 0.05)


def _b9(row: Row, record: Record) -> Verdict:
    if row["unit"] == "teams/s":
        return Verdict("≥ 1.55× teams/s vs a client loop over `vllm serve`", ratio(row) >= 1.55)
    return Verdict("— (work, not speed: no target)", None)


def _b10(row: Row, record: Record) -> Verdict:
    if row["unit"] == "graphs/s":
        return Verdict("≥ 1.43× graphs/s vs a client loop over `vllm serve`", ratio(row) >= 1.43)
    return Verdict("— (work, not speed: no target)", None)


def _b12(row: Row, record: Record) -> Verdict:
    return Verdict("— (reported beside the CPU count; two engines share a CPU host's cores)", None)


def _b12r(row: Row, record: Record) -> Verdict:
    """B12 routing: judged on where the runs went, not on speed (two engines on one CPU host
    split its cores). No files: the busier worker's share of each repetition's runs; pinned
    file: every run that declared the file on the file's worker (the rest's share elsewhere is
    shown beside it)."""
    held = [float(x) for x in row.get("file_runs_on_holder") or []]
    if held:
        rest = [float(x) for x in row.get("rest_on_other_worker") or [] if x is not None]
        detail = f"{_pct(min(held))} of the file's runs on its worker"
        if rest:
            detail += f"; the rest {_pct(min(rest))}–{_pct(max(rest))} on the other"
        return Verdict("affinity honoured: 100% of the file's runs on its worker", min(held) == 1.0, detail)
    shares = [float(x) for x in row.get("busier_share") or []]
    if shares:
        worst = max(shares)
        return Verdict("spread within 60/40: busier worker ≤ 60% of the runs", worst <= 0.6, f"busier {_pct(worst)}")
    return Verdict("— (queue wait: reported)", None)


#: B11's trace target: what per-run tracing may cost a chat workload.
B11_TRACE_TARGET = "tracing ≤ 1% of req/s"


def _b11(row: Row, record: Record) -> Verdict:
    name = str(row["name"])
    if "tracing on vs off" in name:
        share = row.get("span_share")
        return measured_trace_verdict(
            row, B11_TRACE_TARGET, None if share is None else float(share), "of the wall time"
        )
    if name.startswith("(a) multi-turn"):
        return Verdict("≥ 1.0× vLLM req/s", ratio(row) >= 1.0)
    if name.startswith("(a) TTFT"):
        return Verdict("TTFT p50 no worse than vLLM's", ratio(row) <= 1.0)
    if name.startswith("(b)"):
        return Verdict("≥ 1.5× vLLM req/s", ratio(row) >= 1.5)
    if name.startswith("1-token request"):
        ms = 1000 * (median(row, "symphony") - median(row, "baseline"))
        return Verdict("within 50 ms of vLLM's p50", ms <= 50, f"{ms:+.0f} ms")
    return Verdict("— (the path without the in-process fast path, for reference)", None)


def _b13(row: Row, record: Record) -> Verdict:
    return Verdict("— (vLLM's own client: reported, no target)", None)


@dataclass(frozen=True)
class Benchmark:
    key: str
    output: str  # the JSON's name in bench/out/ and bench/results/
    title: str
    judge: Callable[[Row, Record], Verdict]
    #: How to read the two sides (column headers).
    sides: tuple[str, str] = ("Symphony", "vLLM")
    #: The ``bench.<module>`` that produces the record; ``None``: retired (its workload changed
    #: into a new benchmark, the protocol's rule 6), so it keeps its row but no longer runs.
    module: str | None = ""
    #: Whether the table shows B1's ceiling beside each ratio.
    ceiling: bool = False

    @property
    def runs(self) -> str | None:
        """The module that produces this benchmark's record (``None`` for a retired one)."""
        return None if self.module is None else (self.module or self.output)


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark(
        "b1",
        "b1_rag_pareto_v2",
        "B1 v2 RAG-Pareto (headline: online pins, corpus larger than both sides' KV)",
        _b1,
        ("Symphony", "vLLM APC"),
        module="b1_rag_pareto",
        ceiling=True,
    ),
    Benchmark(
        "b1-v1",
        "b1_rag_pareto",
        "B1 v1 RAG-Pareto (retired: pinned the generator's true top documents, corpus within the KV)",
        _b1,
        ("Symphony", "vLLM APC"),
        module=None,
        ceiling=True,
    ),
    Benchmark("b2", "b2_completion", "B2 completion", _b2),
    Benchmark("b3", "b3_pred_overhead", "B3 `pred` overhead", _b3, ("Symphony (socket)", "engine in-process")),
    Benchmark(
        "b4",
        "b4_parallel_decode",
        "B4 parallel decode",
        _at_least(1.3, "≥ 1.3×; forks share pages"),
        ("Symphony", "vLLM `n=8`"),
    ),
    Benchmark("b5", "b5_json", "B5 JSON under a schema", _b5),
    Benchmark("b6", "b6_react", "B6 ReAct agents", _b6, ("Symphony", "baseline loop")),
    Benchmark("b7", "b7_mix", "B7 three tenants at once", _b7, ("Symphony (all at once)", "vLLM (in turn)")),
    Benchmark("b8", "b8_sandbox_start", "B8 sandbox start", _b8, ("warm pool", "cold")),
    Benchmark("b9", "b9_swarm", "B9 SWARM", _b9, ("Symphony (run trees)", "client loop over `vllm serve`")),
    Benchmark("b10", "b10_got", "B10 Graph-of-Thought", _b10, ("Symphony", "client loop over `vllm serve`")),
    Benchmark("b11", "b11_multiturn", "B11 multi-turn chat (OpenAI protocol)", _b11, ("Symphony", "`vllm serve`")),
    Benchmark("b12", "b12_scaleout", "B12 scale-out", _b12, ("two workers", "one worker")),
    Benchmark("b12r", "b12_routing", "B12 routing (whole stack)", _b12r, ("two workers", "one worker")),
    Benchmark(
        "b13", "b13_vllm_client", "B13 vLLM's own client (`vllm bench serve`)", _b13, ("Symphony `/v1`", "`vllm serve`")
    ),
)


# ------------------------------------------------------------------------- B1's ceiling
def b1_ceiling(row: Row, record: Record) -> float | None:
    """The most B1 can show at this α on this hardware: vLLM's time a repetition over that time
    less its recompute, ``T_vllm / (T_vllm - recompute)``.

    vLLM recomputes the document tokens its prefix cache missed, at the per-token prefill cost
    of its own ingest; everything else (questions, decodes) both sides do. A system that
    recomputed nothing, paid nothing for its misses and did the common work at vLLM's own speed
    would take ``T_vllm - recompute``: the share of vLLM's time saved sets the ratio's ceiling.
    It depends on the baseline's figures only, not on how fast Symphony ran. Needs the record's
    ingest row, the workload sizes and vLLM's cache hit share (cached ÷ prompt tokens, question
    tokens included); ``None`` without them, or where the estimated recompute is not below vLLM's
    measured time (the per-token estimate does not hold there).
    """
    hits = row.get("vllm_prompt_cache_hit") or []
    cfg = record.get("config", {})
    ingest = next((c for c in record.get("comparisons", []) if c["name"].startswith("ingest")), None)
    needed = ("docs", "doc_tokens", "question_tokens", "requests")
    if not hits or ingest is None or any(k not in cfg for k in needed):
        return None
    doc, question, requests = cfg["doc_tokens"], cfg["question_tokens"], cfg["requests"]
    prefill_s_per_token = median(ingest, "baseline") / (cfg["docs"] * doc)
    missed_doc_tokens = requests * max(0.0, (1 - statistics.median(hits)) * (doc + question) - question)
    recompute_s = missed_doc_tokens * prefill_s_per_token
    vllm_s = requests / median(row, "baseline")
    return vllm_s / (vllm_s - recompute_s) if recompute_s < vllm_s else None


# --------------------------------------------------------------------------- formatting
def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _sig(v: float) -> str:
    """Three significant digits, trailing zeros kept (``1.70``, ``59.0``, ``313``)."""
    return f"{v:#.3g}".rstrip(".") if abs(v) < 1000 else f"{v:.0f}"


def number(v: float, unit: str) -> str:
    """A value as a reader wants it: ``1/16.0 s`` for a rate of whole jobs, ms below a second."""
    if unit == "1/s":
        return f"1/{1 / v:.1f} s"
    if unit == "s":
        return f"{1000 * v:.0f} ms" if v < 1 else f"{v:.1f} s"
    return f"{_sig(v)} {unit}"


def side_cell(row: Row, side: str) -> str:
    values = row[side].get("values") or []
    med = number(median(row, side), row["unit"])
    if len(values) < 2:
        return med
    if row["unit"] == "1/s":
        reps = ", ".join(f"1/{1 / v:.1f}" for v in values)
    elif row["unit"] == "s":
        reps = ", ".join(number(v, "s") for v in values)
    else:
        reps = ", ".join(_sig(v) for v in values)
    return f"{med} ({reps})"


def ratio_cell(row: Row) -> str:
    r = ratio(row)
    text = (
        f"{r:.3f}× ({100 * (r - 1):+.1f}%)"
        if row["unit"] == "ms" and not row.get("higher_is_better", True)
        else f"{r:.2f}×"
    )
    paired = (row.get("paired_ratio") or {}).get("values") or []
    if paired:
        text += f"; paired {statistics.median(paired):.2f}× ({min(paired):.2f}–{max(paired):.2f})"
    return text


def machine_cell(record: Record) -> str:
    m = record.get("machine") or {}
    if m.get("description"):
        return str(m["description"])
    gpu = m.get("gpu") or "no GPU"
    return f"{m.get('cpus', '?')} CPUs, {gpu}, torch {m.get('torch', '?')}, {m.get('platform', '?')}"


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


#: Flags every benchmark takes that do not change its workload's size.
COMMON_FLAGS = frozenset({"--model", "--reps", "--dtype", "--seed"})


def workload_flags(command: str) -> list[str]:
    """The flags of ``command`` that resize the workload (a scaled-down or scaled-up run)."""
    words = command.split()
    out: list[str] = []
    for i, w in enumerate(words):
        if w.startswith("--") and w.split("=")[0] not in COMMON_FLAGS and w != "--quick":
            value = words[i + 1] if "=" not in w and i + 1 < len(words) and not words[i + 1].startswith("--") else ""
            out.append(f"{w} {value}".strip())
    return out


def table(bench: Benchmark, record: Record | None) -> str:
    """One benchmark's section: run line, table, the record's notes."""
    head = f"## {bench.title}\n\n"
    with_ceiling = bench.ceiling
    cols = [
        "measure",
        *bench.sides,
        "ratio",
        *(["ceiling here (est.)"] if with_ceiling else []),
        "target",
        "met?",
        "notes",
    ]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    if record is None:
        blank = [""] * (len(cols) - 2)
        lines.append("| " + " | ".join(["—", *blank, "not measured"]) + " |")
        return head + "No record in `bench/results/`: not measured.\n\n" + "\n".join(lines) + "\n"
    cfg = record.get("config", {})
    reps = cfg.get("reps", "?")
    code = record.get("code") or {}
    commit = (
        f" · commit `{code['commit'][:10]}`{' + uncommitted changes' if code.get('dirty') else ''}"
        if code.get("commit")
        else ""
    )
    run = (
        f"Run {str(record.get('started', '?'))[:10]} · {machine_cell(record)} · "
        f"{reps} repetitions{commit} · `{record.get('command') or 'command not recorded'}`\n\n"
    )
    problems = protocol_problems(record)
    if problems:
        run += (
            f"**Not a result under the benchmark protocol** ({'; '.join(problems)}): its verdicts are not counted.\n\n"
        )
    else:
        protocol = record["protocol"]
        loads = ", ".join(f"{x:.1f}" for x in protocol.get("load_per_rep", []))
        others = ", ".join(f"{r['other_cpus']:.2f}" for r in protocol.get("cpu_per_rep") or [])
        other = f"; cores used by other work during each repetition: {others}" if others else ""
        busy = " **Busy host**: past the protocol's bound." if protocol.get("busy") else ""
        run += (
            f"Protocol {protocol['version']}: load average {protocol.get('load_before', 0):.1f} before the run, "
            f"{loads or '—'} at each repetition{other}.{busy}\n\n"
        )
    quick = " quick mode: tiny random model, not a result." if cfg.get("quick") else ""
    flags = workload_flags(str(record.get("command") or ""))
    if flags:
        run += f"**Workload sizes set by flags, not the module's defaults:** `{' '.join(flags)}`.\n\n"
    for row in record.get("comparisons", []):
        verdict = bench.judge(row, record)
        cells = [row["name"], side_cell(row, "symphony"), side_cell(row, "baseline"), ratio_cell(row)]
        verdict_cell = verdict.cell() if not problems else f"not counted ({verdict.cell()})"
        if with_ceiling:
            ceiling = b1_ceiling(row, record)
            cells.append("—" if ceiling is None else f"{ceiling:.2f}×")
        cells += [verdict.target, verdict_cell, (str(row.get("note", "")) + quick).strip()]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    notes = "".join(f"\n* {n}" for n in record.get("notes", []))
    return head + run + "\n".join(lines) + "\n" + (notes + "\n" if notes else "")


def overview(records: Mapping[str, Record | None]) -> str:
    """One line per benchmark: run date and which of its targeted rows met their target."""
    lines = ["| benchmark | run | protocol | rows meeting their target | missed |", "|---|---|---|---|---|"]
    for bench in BENCHMARKS:
        record = records.get(bench.key)
        if record is None:
            lines.append(f"| {bench.title} | not measured | — | — | — |")
            continue
        judged = [(row, bench.judge(row, record)) for row in record.get("comparisons", [])]
        targeted = [(row, v) for row, v in judged if v.met is not None]
        missed = [row["name"] for row, v in targeted if not v.met]
        met = len(targeted) - len(missed)
        if protocol_problems(record):
            met_cell, missed_cell = "not counted", "—"
        else:
            met_cell, missed_cell = f"{met} of {len(targeted)}", _cell(", ".join(missed)) or "—"
        lines.append(
            f"| {bench.title} | {str(record.get('started', '?'))[:10]} | {protocol_cell(record)} | {met_cell} | "
            f"{missed_cell} |"
        )
    return "\n".join(lines) + "\n"


HEADER = """# Benchmark results

Generated by `python -m bench results` (and at the end of every full-mode `python -m bench
<b>|all`) from the records in `bench/results/`; do not edit by hand. Each section is the
benchmark's latest full-mode run: both sides measured in one process tree, repetitions
interleaved, figures are medians with every repetition in brackets, ratio = Symphony ÷ baseline of
the medians, and beside it the median (min–max) of each repetition's paired ratio. A record that
does not prove it followed the benchmark protocol (`bench/README.md`, "The protocol": equal KV
bytes, forward threads, CPUs, OpenMP wait policy, dtype and batch on both sides, at least 5
repetitions, the host's load recorded) is shown with why, and its verdicts are not counted. How
each benchmark works: `bench/README.md`; what the runs found and why targets are missed:
`bench/NOTES.md`.

B1's "ceiling here (est.)" estimates the most its ratio can reach on this hardware: vLLM's time a
repetition over that time less its recompute of the document tokens its cache missed (at its own
ingest's prefill cost per token), i.e. a system that recomputes nothing, pays nothing for a miss
and does the work both sides do at vLLM's speed (`bench.results.b1_ceiling`). A ratio above it
means Symphony did that common work faster than vLLM.

"""


def render(records: Mapping[str, Record | None]) -> str:
    parts = [HEADER, overview(records)]
    parts += ["\n" + table(bench, records.get(bench.key)) for bench in BENCHMARKS]
    return "".join(parts)


def load_records(directory: Path = RECORDS_DIR) -> dict[str, Record | None]:
    out: dict[str, Record | None] = {}
    for bench in BENCHMARKS:
        path = directory / f"{bench.output}.json"
        out[bench.key] = json.loads(path.read_text()) if path.exists() else None
    return out


def record_run(output_json: Path, directory: Path = RECORDS_DIR) -> Path | None:
    """Keep a full-mode run's JSON as its benchmark's record; a ``--quick`` run is never kept
    (its tiny random model says nothing about Symphony vs vLLM)."""
    data = json.loads(output_json.read_text())
    if data.get("config", {}).get("quick"):
        return None
    directory.mkdir(parents=True, exist_ok=True)
    dest = directory / output_json.name
    dest.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    return dest


def write(directory: Path = RECORDS_DIR, out: Path = RESULTS_MD) -> Path:
    out.write_text(render(load_records(directory)))
    return out
