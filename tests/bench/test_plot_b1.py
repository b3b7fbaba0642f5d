"""The B1 plot's sources: a run's JSON, and B1's committed record when no full-mode run is there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import plot_b1


def _run(quick: bool) -> dict:
    return {
        "name": "b1_rag_pareto_v2",
        "started": "2026-11-25T00:10:00+0000",
        "config": {"docs": 200, "doc_tokens": 1024, "requests": 64, "in_flight": 8, "quick": quick},
        "comparisons": [
            {"name": "ingest all documents", "unit": "s", "symphony": {"values": [1.0]}, "baseline": {"values": [2.0]}},
            {
                "name": "alpha 0.5",
                "alpha": 0.5,
                "unit": "req/s",
                "symphony": {"values": [3.57, 3.53, 3.39]},
                "baseline": {"values": [0.88, 0.88, 0.80]},
            },
            {
                "name": "alpha 3.0",
                "alpha": 3.0,
                "unit": "req/s",
                "symphony": {"values": [4.0, 4.29, 4.86]},
                "baseline": {"values": [3.13, 3.73, 4.06]},
            },
        ],
    }


def test_reads_the_alpha_rows_of_a_run(tmp_path: Path) -> None:
    path = tmp_path / "b1_rag_pareto_v2.json"
    path.write_text(json.dumps(_run(quick=False)))
    curve = plot_b1.from_json(path)
    assert [p.alpha for p in curve.points] == [0.5, 3.0]
    assert curve.points[0].symphony == (3.57, 3.53, 3.39)
    assert curve.points[0].ratio == pytest.approx(3.53 / 0.88)
    assert "200 docs x 1024 tok" in curve.source and "2026-11-25" in curve.source


def test_a_quick_run_falls_back_to_the_committed_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out, records = tmp_path / "out", tmp_path / "results"
    out.mkdir(), records.mkdir()
    (out / "b1_rag_pareto_v2.json").write_text(json.dumps(_run(quick=True)))
    (records / "b1_rag_pareto_v2.json").write_text(json.dumps(_run(quick=False)))
    monkeypatch.setattr(plot_b1, "OUT_DIR", out)
    monkeypatch.setattr(plot_b1, "RECORD", records / "b1_rag_pareto_v2.json")
    curve = plot_b1.load(None)
    assert curve.source.startswith("b1_rag_pareto_v2.json")
    assert [p.alpha for p in curve.points] == [0.5, 3.0]
