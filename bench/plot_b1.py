"""The B1 (v2) curve as a PNG: requests/s of both sides and their ratio against Pareto alpha.

Source, in order: ``--json PATH``; ``bench/out/b1_rag_pareto_v2.json`` when it is a full-mode run
(a ``--quick`` run's tiny random model says nothing, so it is never plotted); otherwise B1's
record in ``bench/results/`` (its latest full-mode run, what ``bench/RESULTS.md`` shows). Each point
is the median of the repetitions, the bars span min..max (the machines are noisy).

``python -m bench.plot_b1 [--json PATH] [--out bench/plots/b1_rag_pareto_v2.png]`` — needs
matplotlib (a dev dependency, not part of the service).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.harness import OUT_DIR, ROOT

DEFAULT_OUT = ROOT / "bench" / "plots" / "b1_rag_pareto_v2.png"
RECORD = ROOT / "bench" / "results" / "b1_rag_pareto_v2.json"


@dataclass(frozen=True)
class Point:
    alpha: float
    symphony: tuple[float, ...]
    baseline: tuple[float, ...]

    @property
    def ratio(self) -> float:
        return statistics.median(self.symphony) / statistics.median(self.baseline)


@dataclass(frozen=True)
class Curve:
    points: tuple[Point, ...]
    source: str


def from_json(path: Path) -> Curve:
    data = json.loads(path.read_text())
    pts = [
        Point(c["alpha"], tuple(c["symphony"]["values"]), tuple(c["baseline"]["values"]))
        for c in data["comparisons"]
        if "alpha" in c
    ]
    cfg = data["config"]
    src = (
        f"{path.name}: {cfg['docs']} docs x {cfg['doc_tokens']} tok, {cfg['requests']} req/rep, "
        f"{cfg['in_flight']} in flight, {data['started'][:10]}"
    )
    return Curve(tuple(pts), src)


def load(json_path: Path | None) -> Curve:
    if json_path is not None:
        return from_json(json_path)
    default = OUT_DIR / "b1_rag_pareto_v2.json"
    if default.exists() and not json.loads(default.read_text())["config"].get("quick"):
        return from_json(default)
    return from_json(RECORD)


def plot(curve: Curve, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    alphas = [p.alpha for p in curve.points]
    fig, (ax, rx) = plt.subplots(2, 1, figsize=(7, 6.5), sharex=True, height_ratios=[3, 2])
    for label, pick, color in (
        ("Symphony (KV files, online pins)", lambda p: p.symphony, "tab:blue"),
        ("vLLM APC (same KV bytes)", lambda p: p.baseline, "tab:orange"),
    ):
        med = [statistics.median(pick(p)) for p in curve.points]
        lo = [m - min(pick(p)) for m, p in zip(med, curve.points, strict=True)]
        hi = [max(pick(p)) - m for m, p in zip(med, curve.points, strict=True)]
        ax.errorbar(alphas, med, yerr=[lo, hi], marker="o", capsize=3, label=label, color=color)
    ax.set_ylabel("requests / s (median, min..max)")
    ax.set_title("B1 v2 RAG-Pareto", fontsize=11)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    rx.plot(alphas, [p.ratio for p in curve.points], marker="s", color="tab:green", label="Symphony / vLLM")
    rx.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="1x (floor)")
    rx.axhline(7.0, color="tab:red", linestyle=":", linewidth=1, label="7x (target where skew matters)")
    rx.set_yscale("log")
    rx.set_xlabel("Pareto alpha (document popularity skew)")
    rx.set_ylabel("ratio")
    rx.legend(fontsize=8)
    rx.grid(alpha=0.3, which="both")
    fig.text(0.5, 0.005, curve.source, ha="center", fontsize=7, color="dimgrey")
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    a = p.parse_args(argv)
    curve = load(a.json)
    print(f"wrote {plot(curve, a.out)} from {curve.source}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
