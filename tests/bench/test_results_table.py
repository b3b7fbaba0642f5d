# ruff: noqa: RUF001 -- the page is typographic markdown (multiplication sign, alpha, en dash).
"""bench/RESULTS.md is generated from one record per benchmark: the cells, the ratio, the
verdict against the target, B1's ceiling, and a benchmark without a record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import results


def _side(*values: float) -> dict:
    return {"median": sorted(values)[len(values) // 2], "values": list(values)}


def _cmp(name: str, unit: str, s: dict, b: dict, higher_is_better: bool = True, **extra: object) -> dict:
    return {**extra, "name": name, "unit": unit, "symphony": s, "baseline": b, "higher_is_better": higher_is_better}


SIDE = {
    "forward_threads": 2,
    "cpu_affinity": [0, 1],
    "omp_wait_policy": "PASSIVE",
    "dtype": "float32",
    "max_batch": 64,
    "kv_bytes": 1 << 30,
}


def _protocol(**baseline: object) -> dict:
    return {
        "version": 1,
        "sides": {"symphony": dict(SIDE), "baseline": {**SIDE, **baseline}},
        "load_before": 0.4,
        "load_per_rep": [2.1, 2.0, 2.2, 2.1, 2.0],
        "busy": False,
    }


def _record(name: str, comparisons: list[dict], command: str = "python -m bench.x --model m", **config: object) -> dict:
    return {
        "name": name,
        "config": {"model": "m", "quick": False, "reps": 5, **config},
        "started": "2026-11-24T21:00:00+0000",
        "machine": {"cpus": 2, "gpu": None, "torch": "2.13", "platform": "Linux-x86_64"},
        "command": command,
        "protocol": _protocol(),
        "comparisons": comparisons,
        "memory": {},
        "notes": ["a note of the run"],
    }


def _rows(markdown: str, section: str) -> list[list[str]]:
    """The table rows of one ``## section`` (header and separator left out), as cell lists."""
    body = markdown.split(f"## {section}", 1)[1].split("\n## ", 1)[0]
    lines = [ln for ln in body.splitlines() if ln.startswith("| ")]
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[1:]]


def test_cells_ratio_and_verdicts_from_the_records() -> None:
    b2 = _record(
        "b2_completion",
        [
            _cmp("socket only", "tok/s", _side(179.0, 187.6, 184.0), _side(176.7, 179.7, 179.5)),
            _cmp("gVisor, warm", "tok/s", _side(154.3, 160.1, 158.0), _side(176.7, 179.7, 179.5)),
        ],
    )
    b3 = _record(
        "b3_pred_overhead",
        [
            _cmp("decode step, batch 1", "ms", _side(50.0), _side(40.0), False),
            _cmp("decode step, batch 32", "ms", _side(90.2, 91.0, 89.0), _side(86.2, 86.0, 87.0), False),
        ],
    )
    md = results.render({"b2": b2, "b3": b3})

    socket, warm = _rows(md, "B2 completion")
    assert socket[0] == "socket only"
    assert socket[1] == "184 tok/s (179, 188, 184)"  # median first, every repetition after
    assert socket[2] == "180 tok/s (177, 180, 180)"
    assert socket[3] == f"{184.0 / 179.5:.2f}×"  # ratio of the medians, computed here
    assert socket[5] == "met"
    assert warm[3] == f"{158.0 / 179.5:.2f}×" and warm[5] == "**missed**"  # 0.88 < 0.97

    batch1, batch32 = _rows(md, "B3 `pred` overhead")
    assert batch1[3] == "1.250× (+25.0%)" and batch1[5].startswith("—")  # no target below batch 8
    assert batch32[3] == f"{90.2 / 86.2:.3f}× (+4.6%)" and batch32[5] == "met"

    b2_section = md.split("## B2 completion", 1)[1].split("\n## ", 1)[0]
    assert "Run 2026-11-24" in b2_section and "`python -m bench.x --model m`" in b2_section
    assert "* a note of the run" in b2_section
    assert "| B2 completion | 2026-11-24 | protocol 1 | 1 of 2 | gVisor, warm |" in md
    assert "load average 0.4 before the run, 2.1, 2.0, 2.2, 2.1, 2.0 at each repetition" in b2_section


def test_a_record_that_does_not_prove_the_protocol_is_shown_with_why_and_not_counted() -> None:
    rows = [_cmp("socket only", "tok/s", _side(184.0, 190.0, 180.0), _side(179.5, 170.0, 181.0))]
    cases = {
        "not produced under the benchmark protocol": {"protocol": None},
        "3 repetitions (at least 5)": {"config": {"model": "m", "quick": False, "reps": 3}},
        "the baseline had less KV memory": {"protocol": _protocol(kv_bytes=1 << 20)},
        "unequal forward_threads: 2 vs 1": {"protocol": _protocol(forward_threads=1)},
        "unequal omp_wait_policy": {"protocol": _protocol(omp_wait_policy="default")},
        "resources not recorded: baseline.kv_bytes": {
            "protocol": {
                **_protocol(),
                "sides": {"symphony": SIDE, "baseline": {k: v for k, v in SIDE.items() if k != "kv_bytes"}},
            }
        },
    }
    for why, change in cases.items():
        record = {**_record("b2_completion", rows), **change}
        assert any(why in p for p in results.protocol_problems(record)), (why, results.protocol_problems(record))
        md = results.render({"b2": record})
        (row,) = _rows(md, "B2 completion")
        assert row[5] == "not counted (met)", row
        assert "**Not a result under the benchmark protocol**" in md and why in md
        assert "| B2 completion | 2026-11-24 | not under the protocol | not counted | — |" in md
    compliant = _record("b2_completion", rows)
    assert results.protocol_problems(compliant) == []
    (row,) = _rows(results.render({"b2": compliant}), "B2 completion")
    assert row[5] == "met"
    busy = {**compliant, "protocol": {**_protocol(), "busy": True}}
    assert "protocol 1 (busy host)" in results.render({"b2": busy})


def test_a_compiled_side_against_an_eager_one_is_not_under_the_protocol() -> None:
    row = _cmp("decode step", "ms", _side(70.0), _side(90.0), higher_is_better=False)
    record = _record("b3_pred_overhead", [row])
    record["protocol"]["sides"]["symphony"]["compiled"] = True
    record["protocol"]["sides"]["baseline"]["compiled"] = False
    assert results.protocol_problems(record) == ["unequal compiled: True vs False"]
    record["protocol"]["sides"]["baseline"]["compiled"] = True
    assert results.protocol_problems(record) == []
    del record["protocol"]["sides"]["baseline"]["compiled"]  # a record from before it was kept
    assert results.protocol_problems(record) == []


def test_the_paired_ratio_is_shown_beside_the_ratio_of_medians() -> None:
    paired = {"median": 1.05, "min": 0.98, "max": 1.1, "values": [1.1, 0.98, 1.05]}
    row = _cmp("socket only", "tok/s", _side(184.0), _side(180.0), paired_ratio=paired)
    (cells,) = _rows(results.render({"b2": _record("b2_completion", [row])}), "B2 completion")
    assert cells[3] == f"{184.0 / 180.0:.2f}×; paired 1.05× (0.98–1.10)"


def test_the_run_line_names_the_commit_it_measured_and_whether_the_tree_was_dirty() -> None:
    row = _cmp("socket only", "tok/s", _side(184.0), _side(180.0))
    clean = {**_record("b2_completion", [row]), "code": {"commit": "0123456789abcdef", "dirty": False}}
    assert "· commit `0123456789` ·" in results.render({"b2": clean})
    dirty = {**clean, "code": {"commit": "0123456789abcdef", "dirty": True}}
    assert "· commit `0123456789` + uncommitted changes ·" in results.render({"b2": dirty})
    assert "commit `" not in results.render({"b2": _record("b2_completion", [row])})  # older records


def test_a_missing_record_reads_not_measured() -> None:
    md = results.render({})
    for bench in results.BENCHMARKS:
        section = md.split(f"## {bench.title}", 1)[1].split("\n## ", 1)[0]
        rows = _rows(md, bench.title)
        assert len(rows) == 1 and rows[0][-1] == "not measured", bench.key
        assert "not measured" in section
    assert f"| {results.BENCHMARKS[0].title} | not measured | — | — | — |" in md


def test_b1_ceiling_and_the_floor() -> None:
    """Ceiling: vLLM's time a repetition over that time less its recompute of the missed
    document tokens (at its ingest's cost per token)."""
    rec = _record(
        "b1_rag_pareto_v2",
        [
            _cmp("ingest all documents", "s", _side(300.0), _side(204.8), False),
            _cmp("alpha 0.5", "req/s", _side(4.0), _side(1.0), alpha=0.5, vllm_prompt_cache_hit=[0.5]),
            _cmp("alpha 3.0", "req/s", _side(0.9), _side(1.0), alpha=3.0, vllm_prompt_cache_hit=[0.97]),
        ],
        docs=200,
        doc_tokens=1024,
        question_tokens=32,
        requests=64,
    )
    # 204.8 s / 204,800 tokens = 1 ms a token; misses (0.5 * 1056 - 32) * 64 = 31,744 tokens
    # = 31.744 s of vLLM's 64 s; at alpha 3 vLLM misses no document token (ceiling 1).
    assert results.b1_ceiling(rec["comparisons"][1], rec) == pytest.approx(64 / (64 - 31.744))
    assert results.b1_ceiling(rec["comparisons"][2], rec) == pytest.approx(1.0)
    assert results.b1_ceiling(rec["comparisons"][0], rec) is None
    b1 = results.BENCHMARKS[0]
    assert b1.key == "b1" and b1.output == "b1_rag_pareto_v2" and b1.runs == "b1_rag_pareto"
    ingest, low, high = _rows(results.render({"b1": rec}), b1.title)
    assert low[3] == "4.00×" and low[4] == f"{64 / (64 - 31.744):.2f}×"
    assert low[6] == "**missed** (7× missed, ≥ 1× met)"
    assert high[4] == "1.00×" and high[6] == "**missed** (below 1×)"
    assert ingest[4] == "—" and ingest[6] == "—"


def test_b1_ceiling_is_none_where_the_recompute_estimate_exceeds_vllms_time() -> None:
    rec = _record(
        "b1_rag_pareto_v2",
        [
            _cmp("ingest all documents", "s", _side(300.0), _side(204.8), False),
            _cmp("alpha 0.5", "req/s", _side(4.0), _side(4.0), alpha=0.5, vllm_prompt_cache_hit=[0.0]),
        ],
        docs=200,
        doc_tokens=1024,
        question_tokens=32,
        requests=64,
    )
    # 64 * 1024 tokens at 1 ms = 65.5 s of recompute against vLLM's 16 s: the estimate fails.
    assert results.b1_ceiling(rec["comparisons"][1], rec) is None


def test_the_retired_b1_keeps_its_row_and_does_not_run() -> None:
    """B1 v1 (oracle pins) changed into B1 v2: its row stays (reading "not measured" without a
    record), ``python -m bench`` no longer runs it, and ``b1`` runs v2 into its own record."""
    from bench import __main__ as bench_main

    v1 = next(b for b in results.BENCHMARKS if b.key == "b1-v1")
    assert v1.output == "b1_rag_pareto" and v1.runs is None
    assert "b1-v1" not in bench_main.MODULES
    assert bench_main.MODULES["b1"] == "bench.b1_rag_pareto" and bench_main.OUTPUTS["b1"] == "b1_rag_pareto_v2"
    (row,) = _rows(results.render({}), v1.title)
    assert row[-1] == "not measured"


def test_b7_and_b8_are_judged_on_their_own_figures() -> None:
    b7 = _record(
        "b7_mix",
        [
            _cmp(
                "mix",
                "1/s",
                _side(1 / 16.0),
                _side(1 / 20.6),
                batch_occupancy=[0.995, 0.999],
                worst_share_deviation=0.21,
            )
        ],
    )
    b8 = _record("b8_sandbox_start", [_cmp("exit (warm vs cold)", "s", _side(0.015), _side(0.54), False)])
    md = results.render({"b7": b7, "b8": b8})
    (mix,) = _rows(md, "B7 three tenants at once")
    assert mix[1] == "1/16.0 s" and mix[3] == "1.29×"
    assert mix[5] == "**missed** (occupancy 99.5%–99.9% met; worst share 21.0% off missed)"
    (exit_,) = _rows(md, "B8 sandbox start")
    assert exit_[1] == "15 ms" and exit_[2] == "540 ms" and exit_[5] == "**missed**"  # cold > 0.5 s


def test_b3_tracing_is_judged_on_its_measured_cost_unless_the_ab_contradicts_it() -> None:
    def traced(batch: int, on: list[float], off: list[float]) -> dict:
        pairs = [a / b for a, b in zip(on, off, strict=True)]
        paired = {"median": sorted(pairs)[2], "min": min(pairs), "max": max(pairs), "values": pairs}
        return _cmp(
            f"decode step, batch {batch}, tracing on vs off", "ms", _side(*on), _side(*off), False, paired_ratio=paired
        )

    rows = [
        traced(1, [58, 55, 59, 58, 56], [64, 64, 56, 57, 63]),  # noisy both ways
        traced(32, [210, 212, 215, 220, 230], [180, 182, 185, 190, 200]),  # every repetition ~15% slower
    ]
    b3 = _record("b3_pred_overhead", rows)
    b3["memory"] = {"trace_call_us": {"spans_kept_us": 2.5, "bucketed_us": 2.0, "off_us": 0.1}}
    assert results.b3_trace_share(rows[0], b3) == pytest.approx(2.5e-6 / 63e-3)
    (one, many) = _rows(results.render({"b3": b3}), "B3 `pred` overhead")
    assert one[5] == "met (span work 0.004% of a step, measured directly; the A/B cannot resolve 1%)", one
    assert (
        many[5].startswith("**missed** (span work 0.043% of a step")
        and "no repetition came within it (1.15×)" in many[5]
    )
    b3["memory"] = {}  # an older record: judged on the A/B alone
    (one, many) = _rows(results.render({"b3": b3}), "B3 `pred` overhead")
    assert one[5] == "met" and many[5] == "**missed**"


def test_b11_rows_are_judged_by_their_own_targets() -> None:
    b11 = _record(
        "b11_multiturn",
        [
            _cmp("(a) multi-turn chat", "req/s", _side(1.1), _side(1.0)),
            _cmp("(a) TTFT p50", "s", _side(0.30), _side(0.25), False),
            _cmp("1-token request p50", "s", _side(0.320), _side(0.290), False),
            _cmp("1-token p50, sandbox path (SYMPHONY_TRUSTED_BUILTIN=0)", "s", _side(0.7), _side(0.29), False),
            _cmp("(b) responses, previous_response_id", "req/s", _side(1.2), _side(1.0)),
        ],
    )
    rows = _rows(results.render({"b11": b11}), "B11 multi-turn chat (OpenAI protocol)")
    verdicts = {row[0]: row[5] for row in rows}
    assert verdicts["(a) multi-turn chat"] == "met"
    assert verdicts["(a) TTFT p50"] == "**missed**"
    assert verdicts["1-token request p50"] == "met (+30 ms)"  # within 50 ms of vLLM's p50
    assert verdicts["1-token p50, sandbox path (SYMPHONY_TRUSTED_BUILTIN=0)"] == "—"
    assert verdicts["(b) responses, previous_response_id"] == "**missed**"  # below 1.5x


def test_b11_tracing_is_judged_on_its_measured_cost_unless_the_ab_contradicts_it() -> None:
    def traced(on: list[float], off: list[float], share: float | None) -> dict:
        pairs = [a / b for a, b in zip(on, off, strict=True)]
        paired = {"median": sorted(pairs)[2], "min": min(pairs), "max": max(pairs), "values": pairs}
        extra = {"span_share": share} if share is not None else {}
        return _cmp(
            "(a) multi-turn chat, tracing on vs off", "req/s", _side(*on), _side(*off), paired_ratio=paired, **extra
        )

    def verdict(row: dict) -> str:
        rows = _rows(results.render({"b11": _record("b11_multiturn", [row])}), "B11 multi-turn chat (OpenAI protocol)")
        return rows[0][5]

    noisy = traced([1.20, 1.25, 1.18, 1.22, 1.30], [1.22, 1.21, 1.24, 1.20, 1.26], 0.0004)
    assert verdict(noisy) == "met (span work 0.040% of the wall time, measured directly; the A/B cannot resolve 1%)"
    slower = traced([1.00, 1.01, 1.02, 1.00, 1.03], [1.20, 1.21, 1.24, 1.20, 1.26], 0.0004)
    assert verdict(slower).startswith("**missed** (span work 0.040%") and "no repetition came within it" in verdict(
        slower
    )
    costly = traced([1.20, 1.25, 1.18, 1.22, 1.30], [1.22, 1.21, 1.24, 1.20, 1.26], 0.02)
    assert verdict(costly).startswith("**missed** (span work 2.000%")
    assert verdict(traced([1.20, 1.25, 1.18, 1.22, 1.30], [1.22, 1.21, 1.24, 1.20, 1.26], None)) == "met"


def test_a_scaled_run_says_so_and_a_quick_run_is_never_recorded(tmp_path: Path) -> None:
    scaled = _record(
        "b4_parallel_decode",
        [_cmp("parallel decode n=8", "tok/s", _side(130.0), _side(100.0))],
        command="python -m bench.b4_parallel_decode --model m --reps 3 --prompt-tokens 256",
    )
    md = results.render({"b4": scaled})
    assert "not the module's defaults:** `--prompt-tokens 256`" in md
    assert _rows(md, "B4 parallel decode")[0][5] == "met"

    quick = tmp_path / "out" / "b4_parallel_decode.json"
    quick.parent.mkdir()
    quick.write_text(json.dumps({**scaled, "config": {**scaled["config"], "quick": True}}))
    assert results.record_run(quick, tmp_path / "records") is None
    full = tmp_path / "out" / "b5_json.json"
    full.write_text(json.dumps(scaled))
    kept = results.record_run(full, tmp_path / "records")
    assert kept is not None and json.loads(kept.read_text()) == scaled
    assert results.load_records(tmp_path / "records")["b5"] == scaled


def test_the_committed_table_is_what_the_records_generate() -> None:
    assert results.RESULTS_MD.read_text() == results.render(results.load_records())


def test_b12_routing_is_judged_on_where_the_runs_went() -> None:
    """No files: the busier worker's share in the worst repetition against 60%; pinned file:
    every run that declared the file on the file's worker; queue waits carry no target."""
    title = "B12 routing (whole stack)"
    spread = {"busier_share": [0.5, 0.5625, 0.5], "runs_per_worker": [{"b12-a": 8, "b12-b": 8}] * 3}
    skewed = {**spread, "busier_share": [0.5, 0.6875, 0.5]}
    pinned = {"busier_share": [0.5] * 3, "file_runs_on_holder": [1.0] * 3, "rest_on_other_worker": [1.0, 0.75, 1.0]}
    missed = {**pinned, "file_runs_on_holder": [1.0, 0.875, 1.0]}
    rows = [
        _cmp("16 runs at once, no files: 2 workers / 1", "runs/s", _side(1.0), _side(1.1), **spread),
        _cmp("queue wait p50, 16 runs at once, no files", "s", _side(2.0), _side(2.1), False),
        _cmp("16 runs at once, half declare a pinned file: 2 workers / 1", "runs/s", _side(1.0), _side(1.1), **pinned),
    ]
    plain, wait, file = _rows(results.render({"b12r": _record("b12_routing", rows)}), title)
    assert plain[5] == "met (busier 56.2%)" and wait[5] == "—"
    assert file[5] == "met (100.0% of the file's runs on its worker; the rest 75.0%–100.0% on the other)"
    rows[0] = {**rows[0], **skewed}
    rows[2] = {**rows[2], **missed}
    plain, _, file = _rows(results.render({"b12r": _record("b12_routing", rows)}), title)
    assert plain[5] == "**missed** (busier 68.8%)"
    assert file[5].startswith("**missed** (87.5% of the file's runs on its worker")
