"""The B1 plot's fallback source: the first B1 table of a RESULTS.md, not every table after it."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.plot_b1 import from_results_md

RESULTS = """# Benchmark results

## B1 RAG-Pareto

### At the spec's size

| alpha | distinct docs per rep | Symphony req/s (3 reps) | vLLM APC req/s (3 reps) | vLLM prompt cache hit | ratio |
|---|---|---|---|---|---|
| 0.5 | 54, 50, 54 | 3.57, 3.53, 3.39 | 0.88, 0.88, 0.80 | 0.35-0.39 | **4.03x** |
| 3.0 | 4, 3, 5 | 4.00, 4.29, 4.86 | 3.13, 3.73, 4.06 | 0.91-0.97 | **1.15x** |
| ingest 200 docs (once) | | 362.5 s | 305.8 s | | 1.19x (time) |

### Scaled down

| alpha | distinct docs | Symphony req/s (3 reps) | vLLM APC req/s (3 reps) | ratio |
|---|---|---|---|---|
| 0.5 | 9 | 2.53, 2.87, 2.84 | 1.11, 0.55, 1.17 | **2.56x** |

## B2 completion

| 1.0 | 7 | 1.0, 1.0 | 2.0, 2.0 | x |
"""


def test_reads_only_the_first_b1_table(tmp_path: Path) -> None:
    path = tmp_path / "RESULTS.md"
    path.write_text(RESULTS)
    curve = from_results_md(path)
    assert [p.alpha for p in curve.points] == [0.5, 3.0]
    assert curve.points[0].symphony == (3.57, 3.53, 3.39)
    assert curve.points[1].baseline == (3.13, 3.73, 4.06)
    assert curve.points[0].ratio == pytest.approx(3.53 / 0.88)


def test_no_table_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "RESULTS.md"
    path.write_text("# Benchmark results\n\n## B1 RAG-Pareto\n\nnothing measured yet\n")
    with pytest.raises(ValueError, match="no B1 table rows"):
        from_results_md(path)
