// Layout of a run's trace as a waterfall: which rows, how deep, where each bar sits on the time
// axis of the window shown, which spans are the slowest, and the axis' ticks. Pure functions,
// so the page component only draws what these say (and the unit test checks the arithmetic).
import type { RunTraceSpan } from "../api/types";

/** Span kinds that are the program's own operations (the worker's spans): the ones ranked for
 * "slowest". The phases around them (run, execute, worker.session, sandbox.run, ...) enclose
 * the operations and would always rank first. */
export const OPERATION_KINDS: ReadonlySet<string> = new Set(["syscall", "io", "wait", "kv_move"]);
/** How many of the slowest operations are highlighted. */
export const SLOWEST_COUNT = 3;

/** A time range in seconds since the run was created. */
export interface TimeWindow {
  start: number;
  end: number;
}

export interface WaterfallRow {
  span: RunTraceSpan;
  /** 0 for the run, 1 for its phases, ... (drawn as indentation). */
  depth: number;
  /** Where the bar starts and how wide it is, in percent of the window; the bar is clipped to
   * the window. A span of no length gets a hairline (`width` 0, drawn with a minimum). */
  left: number;
  width: number;
  /** 1 for the slowest operation, 2 for the next, ...; null when not among the slowest. */
  slowRank: number | null;
}

/** Spans in tree order (each parent followed by its children, children by start time), with
 * their depth. A span whose parent is not in the list is treated as a root. */
export function treeOrder(spans: readonly RunTraceSpan[]): { span: RunTraceSpan; depth: number }[] {
  const ids = new Set(spans.map((s) => s.id));
  const children = new Map<number | null, RunTraceSpan[]>();
  for (const span of spans) {
    const parent = span.parent !== null && ids.has(span.parent) ? span.parent : null;
    const list = children.get(parent) ?? [];
    list.push(span);
    children.set(parent, list);
  }
  for (const list of children.values()) list.sort((a, b) => a.start_s - b.start_s || a.id - b.id);
  const out: { span: RunTraceSpan; depth: number }[] = [];
  const visit = (parent: number | null, depth: number) => {
    for (const span of children.get(parent) ?? []) {
      out.push({ span, depth });
      visit(span.id, depth + 1);
    }
  };
  visit(null, 0);
  return out;
}

/** The ids of the slowest operations, slowest first (ties: the earlier first). */
export function slowestOperations(spans: readonly RunTraceSpan[], count = SLOWEST_COUNT): number[] {
  return spans
    .filter((s) => OPERATION_KINDS.has(s.kind) && s.duration_s > 0)
    .sort((a, b) => b.duration_s - a.duration_s || a.start_s - b.start_s)
    .slice(0, count)
    .map((s) => s.id);
}

/** The whole trace's time range (at least a millisecond wide, so a bar always has a scale). */
export function fullWindow(spans: readonly RunTraceSpan[]): TimeWindow {
  if (spans.length === 0) return { start: 0, end: 1 };
  const start = Math.min(...spans.map((s) => s.start_s));
  const end = Math.max(...spans.map((s) => s.end_s));
  return { start, end: Math.max(end, start + 0.001) };
}

/** The window that zooms to one span: the span with a margin of 5% of its length each side
 * (a span of no length gets a millisecond around it). */
export function zoomWindow(span: RunTraceSpan): TimeWindow {
  const length = span.end_s - span.start_s;
  const margin = length > 0 ? length * 0.05 : 0.0005;
  return { start: Math.max(0, span.start_s - margin), end: span.end_s + margin };
}

const clamp = (x: number, lo: number, hi: number) => Math.min(hi, Math.max(lo, x));

/** The rows the waterfall draws for `window`: the spans that overlap it, in tree order, with
 * their bars placed in percent of the window. */
export function layoutRows(spans: readonly RunTraceSpan[], window: TimeWindow): WaterfallRow[] {
  const ranks = new Map(slowestOperations(spans).map((id, i) => [id, i + 1]));
  const length = window.end - window.start;
  return treeOrder(spans)
    .filter(({ span }) => span.end_s >= window.start && span.start_s <= window.end)
    .map(({ span, depth }) => {
      const from = clamp((span.start_s - window.start) / length, 0, 1);
      const to = clamp((span.end_s - window.start) / length, 0, 1);
      return { span, depth, left: from * 100, width: (to - from) * 100, slowRank: ranks.get(span.id) ?? null };
    });
}

/** A step of 1, 2 or 5 times a power of ten that cuts `length` into at most `maxTicks` parts. */
export function tickStep(length: number, maxTicks = 5): number {
  const raw = length / Math.max(1, maxTicks);
  if (!(raw > 0) || !Number.isFinite(raw)) return 1;
  const power = 10 ** Math.floor(Math.log10(raw));
  for (const m of [1, 2, 5, 10]) if (m * power >= raw) return m * power;
  return 10 * power;
}

/** The axis' ticks within `window`: each a time and its position in percent. */
export function ticks(window: TimeWindow, maxTicks = 5): { t: number; at: number }[] {
  const step = tickStep(window.end - window.start, maxTicks);
  const out: { t: number; at: number }[] = [];
  const first = Math.ceil(window.start / step - 1e-9) * step;
  for (let t = first; t <= window.end + 1e-9; t += step) {
    out.push({ t: Number(t.toPrecision(12)), at: ((t - window.start) / (window.end - window.start)) * 100 });
  }
  return out;
}

/** Seconds as a person reads them: µs, ms or s with three significant digits. */
export function formatSeconds(s: number): string {
  const abs = Math.abs(s);
  if (abs === 0) return "0 s";
  if (abs < 0.001) return `${Number((s * 1e6).toPrecision(3))} µs`;
  if (abs < 1) return `${Number((s * 1000).toPrecision(3))} ms`;
  return `${Number(s.toPrecision(3))} s`;
}
