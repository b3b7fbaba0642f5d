"""How the CLI prints answers: JSON for scripts, tables and ``key: value`` lines for people.

JSON is the API's objects unchanged (stable: only fields the API adds may appear). The human
forms pick the columns a person scans and shorten timestamps; they may change between versions.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

#: Columns of the human tables: (heading, field).
COLUMNS: dict[str, Sequence[tuple[str, str]]] = {
    "runs": (("ID", "id"), ("STATUS", "status"), ("PROGRAM", "program_name"), ("PROGRAM ID", "program"),
             ("VERSION", "version"), ("CREATED", "created_at"), ("ERROR", "error")),
    "programs": (("ID", "id"), ("NAME", "name"), ("LATEST", "latest_version"), ("CREATED", "created_at"),
                 ("DESCRIPTION", "description")),
    "kv": (("NAME", "name"), ("TOKENS", "tokens"), ("BYTES", "bytes"), ("RESIDENCY", "residency"),
           ("PINNED", "pinned"), ("LAST USED", "last_used")),
}  # fmt: skip
CELL_CHARS = 60


def plural(count: int, word: str, words: str | None = None) -> str:
    """``1 event``, ``2 events``, ``0 events``: a count with its noun agreeing (``words``: an
    irregular plural)."""
    return f"{count} {word if count == 1 else words or word + 's'}"


def run_title(run: Mapping[str, Any]) -> str:
    """What to call a run, which has no name of its own: its program's name, the function it
    runs when not ``main``, and its first argument (``completion prompt="What is..."``)."""
    title = str(run.get("program_name") or f"program {run.get('program')}")
    if run.get("entry"):
        title += f" {run['entry']}"
    args = run.get("args")
    if isinstance(args, dict) and args:
        key, value = next(iter(args.items()))
        shown = cell(value) if value != "" else ""
        title += f' {key}="{shown}"' if isinstance(value, str) else f" {key}={shown}"
    return title


def as_json(data: object, compact: bool = False) -> str:
    return json.dumps(data, indent=None if compact else 2)


def cell(value: object) -> str:
    """One table cell: timestamps to the second, ``-`` for nothing, long text cut."""
    if value is None or value == "":
        return "-"
    if isinstance(value, str) and len(value) >= 19 and value[4] == "-" and value[10] == "T":
        return value[:19].replace("T", " ")
    text = value if isinstance(value, str) else json.dumps(value)
    text = " ".join(text.split())
    return text if len(text) <= CELL_CHARS else text[: CELL_CHARS - 1] + "…"


def table(rows: Sequence[dict], kind: str) -> str:
    """Aligned columns with a heading line; ``(none)`` for an empty listing."""
    if not rows:
        return "(none)"
    columns = COLUMNS[kind]
    grid = [[heading for heading, _ in columns]] + [[cell(row.get(field)) for _, field in columns] for row in rows]
    widths = [max(len(line[i]) for line in grid) for i in range(len(columns))]
    return "\n".join("  ".join(text.ljust(w) for text, w in zip(line, widths, strict=True)).rstrip() for line in grid)


def run_record(run: Mapping[str, Any]) -> str:
    """``runs show``: a line naming the run (:func:`run_title`), then its fields, then its
    timings and usage one per line (``-`` for a phase that has not happened; usage appears once
    the run has ended), then the runs it spawned, one a line (``id status entry``)."""
    base = {k: v for k, v in run.items() if k not in ("usage", "timings", "children")}
    lines = [f"{run_title(run)}  (run {run.get('id')}, {run.get('status')})", "", record(base)]
    timings = run.get("timings") or {}
    usage = run.get("usage")
    extra: dict[str, object] = {}
    for key, value in timings.items():
        extra[key] = "-" if value is None else f"{value:g}"
    if usage:
        cost = usage.get("cost") or {}
        for key, value in usage.items():
            if key != "cost":
                extra[key] = f"{value:g}" if isinstance(value, float) else value
        extra["cost"] = f"{cost.get('total', '0')} {cost.get('currency', 'USD')}"
    elif "usage" in run:
        extra["usage"] = "(recorded when the run ends)"
    if extra:
        lines += ["", record(extra)]
    children = run.get("children") or []
    if children:
        lines += ["", f"children ({len(children)}):"]
        lines += [f"  {c['id']}  {c['status']:<9}  {c.get('entry') or 'main'}" for c in children]
    return "\n".join(lines)


def record(obj: dict) -> str:
    """One object as ``key: value`` lines (nested values as compact JSON, uncut)."""
    width = max((len(key) for key in obj), default=0)
    lines = []
    for key, value in obj.items():
        text = value if isinstance(value, str) else json.dumps(value)
        lines.append(f"{key.ljust(width)}  {text if text != '' else '-'}")
    return "\n".join(lines)


#: Span kinds that contain others (their time is their children's): left out of the top spans.
TRACE_CONTAINERS = frozenset({"run", "worker"})
TRACE_CONTAINER_NAMES = frozenset({"execute", "sandbox.run", "program.run"})


def trace_summary(trace: Mapping[str, Any], top: int = 5) -> str:
    """A run's trace as text: its total, where the time went per kind of span, and its
    ``top`` longest spans (aggregated ones by their summed time)."""
    spans = trace.get("spans") or []
    root = next((s for s in spans if s.get("parent") is None), None)
    total = root["duration_s"] if root else 0.0
    lines = [f"run {trace.get('run')} {trace.get('status')}: {total:.3f}s"]
    if not trace.get("complete"):
        lines.append("(no spans from its execution yet: they are recorded when the run ends)")
    elif trace.get("worker_tracing") == "off":
        lines.append("(tracing was off on its worker: no per-call spans, only the control plane's marks)")
    by_kind: dict[str, tuple[float, int]] = {}
    leaves = [s for s in spans if s.get("kind") not in TRACE_CONTAINERS and s.get("name") not in TRACE_CONTAINER_NAMES]
    for span in leaves:
        count = int(span["attrs"].get("count", 1)) if span["attrs"].get("aggregated") else 1
        seconds, calls = by_kind.get(span["kind"], (0.0, 0))
        by_kind[span["kind"]] = (seconds + span["duration_s"], calls + count)
    if by_kind:
        lines.append("where the time went (spans may overlap):")
        for kind, (seconds, calls) in sorted(by_kind.items(), key=lambda kv: -kv[1][0]):
            lines.append(f"  {kind:<10} {seconds:9.3f}s  {plural(calls, 'span')}")
    longest = sorted(leaves, key=lambda s: -s["duration_s"])[:top]
    if longest:
        lines.append(f"top {len(longest)} spans:")
        for span in longest:
            attrs = span["attrs"]
            shown = " ".join(f"{k}={v}" for k, v in attrs.items() if k not in ("aggregated",))
            lines.append(
                f"  {span['duration_s']:9.3f}s  {span['name']:<16} at +{span['start_s']:.3f}s"
                + (f"  {cell(shown)}" if shown else "")
            )
    if trace.get("dropped"):
        lines.append(f"({plural(int(trace['dropped']), 'span')} past the trace's bound were only counted)")
    return "\n".join(lines)
