"""Smoke check of the benchmark harness: ``python -m bench all --quick`` (B1-B3 in one process)
and B2 (with its sandboxed side), B4-B8 each with ``--quick`` produce ratios.

Asserts that every benchmark ran, measured both sides and computed a finite positive ratio. It
does not assert the values: on shared 2-core CI machines and the tiny random model they say
nothing about Symphony vs vLLM (bench/RESULTS.md holds the real figures).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import results

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.integration, pytest.mark.vllm]


def _bench(tmp_path: Path, *args: str) -> None:
    env = {**os.environ, "SYMPHONY_BENCH_OUT": str(tmp_path), "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'sandbox'}"}
    # Both sides eager: a compile per worker and baseline start would not fit the timeout.
    env["SYMPHONY_COMPILE"] = "off"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", *args, "--quick"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=480,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]


def _assert_equal_resources(bench: str, record: dict) -> None:
    """The record proves the protocol's equal resources, read from the processes that ran: the
    only thing a ``--reps 1`` quick run misses is the repetitions. B12 compares two workers with
    one, so its sides are recorded but not alike."""
    problems = results.protocol_problems(record)
    sides = record["protocol"]["sides"]
    assert all(key in sides[side] for side in ("symphony", "baseline") for key in results.SIDE_KEYS), sides
    for side in ("symphony", "baseline"):
        assert sides[side]["cpu_affinity"] and sides[side]["forward_threads"] >= 1 and sides[side]["kv_bytes"] > 0
    if bench != "b12":
        reps = record["config"]["reps"]
        expected = [] if reps >= results.MIN_REPS else [f"{reps} repetitions (at least {results.MIN_REPS})"]
        assert problems == expected, (bench, problems)


def _assert_ratios(bench: str, rows: list[dict]) -> None:
    assert rows, f"{bench} produced no comparison"
    for row in rows:
        for key in ("symphony", "baseline", "ratio"):
            value = row[key]
            assert isinstance(value, float) and math.isfinite(value) and value > 0, (bench, row)


def test_bench_all_quick_produces_ratios(default_model_dir: Path, tmp_path: Path) -> None:
    _bench(tmp_path, "all")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["failed"] == []
    assert set(summary["results"]) == {"b1", "b2", "b3"}
    for bench, rows in summary["results"].items():
        _assert_ratios(bench, rows)
    b1 = json.loads((tmp_path / "b1_rag_pareto_v2.json").read_text())
    assert any(c["name"].startswith("alpha") for c in b1["comparisons"])
    for c in b1["comparisons"]:
        assert len(c["symphony"]["values"]) >= 1 and len(c["baseline"]["values"]) >= 1
    cfg = b1["config"]  # the corpus exceeds the KV; the LIP pinned from what it had served
    assert cfg["corpus_pages"] > cfg["device_pages"] + cfg["host_pages"]
    for c in b1["comparisons"][1:]:
        assert c["pin_changes"]["warmup"] >= 1 and 1 <= len(c["pinned_at_end"]) <= cfg["pin_docs"]
    for output in ("b1_rag_pareto_v2", "b2_completion", "b3_pred_overhead"):
        _assert_equal_resources(output, json.loads((tmp_path / f"{output}.json").read_text()))
    b3 = json.loads((tmp_path / "b3_pred_overhead.json").read_text())
    assert b3["memory"]["pred_reply_bytes"]["pred_then_argmax"] > 0
    assert b3["memory"]["worker_peak_rss_mb"] > 0


#: The quick runs past B1-B3 (``make test`` keeps the B1-B3 run and B2 with its sandboxed side):
#: each starts a vLLM of its own, and some ``vllm serve``, a sandbox pool or a whole control plane
#: (1-4 minutes each here, 16 together), so they are in ``make test-all`` only, for ``make test``
#: to fit CI's time. ``python -m bench bN`` runs the same code at full size for every record.
_HEAVY = pytest.mark.slow


@pytest.mark.parametrize(
    ("bench", "output", "flags"),
    [
        ("b2", "b2_completion", ()),
        pytest.param("b4", "b4_parallel_decode", (), marks=_HEAVY),
        pytest.param("b5", "b5_json", (), marks=_HEAVY),
        pytest.param("b6", "b6_react", ("--serve-baseline", "1"), marks=_HEAVY),
        pytest.param("b7", "b7_mix", (), marks=_HEAVY),
        pytest.param("b8", "b8_sandbox_start", (), marks=_HEAVY),
        pytest.param("b9", "b9_swarm", (), marks=_HEAVY),
        pytest.param("b10", "b10_got", (), marks=_HEAVY),
        pytest.param("b11", "b11_multiturn", (), marks=_HEAVY),
        pytest.param("b12", "b12_scaleout", (), marks=_HEAVY),
        pytest.param("b12r", "b12_routing", (), marks=_HEAVY),
        pytest.param("b13", "b13_vllm_client", (), marks=_HEAVY),
    ],
)
def test_bench_quick_alone_produces_ratios(bench: str, output: str, flags: tuple[str, ...], tmp_path: Path) -> None:
    """Each runs alone (its own worker and baseline sizes). B2 alone also runs its LIP in gVisor
    containers. B4's LIP itself fails the run when its
    forks copied prompt pages instead of sharing them, so a pass also proves copy-on-write.
    B6 also starts ``vllm serve`` (its spec baseline) and drives it over HTTP. B7 runs three
    tenants on one worker; B8 starts cold and warm (pooled) gVisor sandboxes; B9 runs SWARM teams
    as run trees (spawned agents in sandboxes of their own, one shared KV file, channels) through
    the control plane against a client loop over ``vllm serve``; B10 runs
    examples/graph_of_thought.py's graph against a client loop over ``vllm serve``; B11 drives the whole
    control plane and ``vllm serve`` through the ``openai`` client; B12 runs B2's loop on one
    worker and on two at once; B12 routing runs the whole stack with two workers and with one, and
    checks where routing sent the runs (spread, KV file affinity); B13 drives Symphony's ``/v1``
    and ``vllm serve`` with vLLM's own benchmark client (every request must succeed). Every record
    proves both sides ran with equal resources, read from their processes."""
    _bench(tmp_path, bench, "--reps", "1", *flags)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["failed"] == [] and set(summary["results"]) == {bench}
    _assert_ratios(bench, summary["results"][bench])
    detail = json.loads((tmp_path / f"{output}.json").read_text())
    _assert_equal_resources(bench, detail)
    if bench == "b12r":  # where the runs went, read from the run rows through the REST API
        plain, _, _, pinned = detail["comparisons"][:4]
        cfg = detail["config"]
        for row in (plain, pinned):
            (placed,) = row["runs_per_worker"]
            assert set(placed) == {"b12-a", "b12-b"} and sum(placed.values()) == cfg["runs"], placed
        assert min(plain["runs_per_worker"][0].values()) >= 1, plain  # load-aware: both got runs
        assert pinned["file_runs_on_holder"] == [1.0] and pinned["holder"] in ("b12-a", "b12-b"), pinned
    elif bench != "b12":  # B12 compares throughput only; its two workers' memory is not recorded
        assert detail["memory"]["worker_peak_rss_mb"] > 0
    if bench == "b6":
        assert any(c["name"].endswith("vs vllm serve") for c in detail["comparisons"])
    if bench == "b10":  # both sides did every level of every graph and reported their work
        rate = detail["comparisons"][0]
        assert rate["unit"] == "graphs/s" and all(0 <= a <= 1 for a in rate["same_pair_chosen"])
        work = {c["name"]: c for c in detail["comparisons"][1:]}
        for side in ("symphony", "baseline"):
            prefilled = work["tokens prefilled per graph"][side]["median"]
            assert 0 < prefilled < work["tokens computed per graph"][side]["median"]
    if bench == "b9":  # each team computed its context once: its agents forked the shared file
        cfg, rate = detail["config"], detail["comparisons"][0]
        assert rate["unit"] == "teams/s" and all(0 <= a <= 1 for a in rate["same_replies"])
        work = {c["name"]: c for c in detail["comparisons"][1:]}
        turns = cfg["agents"] * cfg["rounds"]
        prefilled = cfg["context_tokens"] + turns * cfg["message_tokens"]
        assert work["tokens prefilled per team"]["symphony"]["values"] == [prefilled]
        assert work["tokens computed per team"]["symphony"]["values"] == [prefilled + turns * cfg["reply_tokens"]]
        assert work["tokens prefilled per team"]["baseline"]["median"] > 0
    if bench == "b13":  # vLLM's client measured requests/s, TTFT and TPOT on both sides
        names = [c["name"] for c in detail["comparisons"]]
        cases = [f"{b}, {d}" for b in ("openai-chat", "openai-responses") for d in ("prefix_repetition", "random")]
        assert names == [n for c in cases for n in (f"vllm bench serve, {c}", f"{c}: TTFT p50", f"{c}: TPOT p50")]
    if bench == "b11":  # both sides through the openai client; (b) waits for /v1/responses
        names = [c["name"] for c in detail["comparisons"]]
        assert names[:3] == ["(a) multi-turn chat", "(a) TTFT p50", "1-token request p50"], names
        assert 0 <= detail["comparisons"][0]["vllm_cached_share"] <= 1
        assert "(b) responses, previous_response_id" in names or detail["config"]["responses_skipped"]
