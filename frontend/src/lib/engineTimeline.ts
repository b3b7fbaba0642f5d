// A worker's engine timeline (`GET /api/v1/staff/workers/<name>/timeline`) laid out for the staff
// page: what the engine did over its last forwards, and where it sat idle. Pure functions, so the
// layout is tested without a browser.
import type { EngineForward } from "../api/types";

/** Forwards listed by their length on the staff page. */
export const LONGEST_COUNT = 5;

export interface TimelineSummary {
  /** Seconds from the first kept forward's start to the last one's end. */
  spanS: number;
  /** Share of that span the engine spent in forwards (0-1). */
  busy: number;
  meanForwardS: number;
  meanBatch: number;
  maxBatch: number;
  promptTokens: number;
  decodeTokens: number;
  /** The longest stretch between two forwards (seconds): work waited on something else. */
  longestIdleS: number;
  /** The most accounts that shared one forward. */
  maxAccounts: number;
}

export function summarize(forwards: readonly EngineForward[]): TimelineSummary | null {
  if (!forwards.length) return null;
  const first = forwards[0].start;
  let end = first;
  let busyS = 0;
  let batches = 0;
  let maxBatch = 0;
  let promptTokens = 0;
  let decodeTokens = 0;
  let longestIdleS = 0;
  let maxAccounts = 0;
  for (const f of forwards) {
    longestIdleS = Math.max(longestIdleS, f.start - end);
    end = Math.max(end, f.start + f.duration_s);
    busyS += f.duration_s;
    batches += f.batch_size;
    maxBatch = Math.max(maxBatch, f.batch_size);
    promptTokens += f.prompt_tokens;
    decodeTokens += f.decode_tokens;
    maxAccounts = Math.max(maxAccounts, f.accounts);
  }
  const spanS = end - first;
  return {
    spanS,
    busy: spanS > 0 ? Math.min(1, busyS / spanS) : 1,
    meanForwardS: busyS / forwards.length,
    meanBatch: batches / forwards.length,
    maxBatch,
    promptTokens,
    decodeTokens,
    longestIdleS,
    maxAccounts,
  };
}

export interface ForwardBar {
  index: number;
  forward: EngineForward;
  /** Position and width on the strip, percent of the kept span. */
  left: number;
  width: number;
  /** Bar height, percent of the strip: the batch size against the largest kept. */
  height: number;
  /** "prefill" when the forward computed more prompt tokens than it decoded, else "decode". */
  kind: "prefill" | "decode";
}

/** Every kept forward as a bar on one strip (a forward shorter than a pixel still shows). */
export function layoutForwards(forwards: readonly EngineForward[], minWidth = 0.15): ForwardBar[] {
  const summary = summarize(forwards);
  if (!summary) return [];
  const first = forwards[0].start;
  const span = summary.spanS || 1;
  return forwards.map((forward, index) => ({
    index,
    forward,
    left: ((forward.start - first) / span) * 100,
    width: Math.max(minWidth, (forward.duration_s / span) * 100),
    height: Math.max(8, (forward.batch_size / (summary.maxBatch || 1)) * 100),
    kind: forward.prompt_tokens > forward.decode_tokens ? "prefill" : "decode",
  }));
}

/** Indexes of the longest forwards, longest first. */
export function longestForwards(forwards: readonly EngineForward[], count = LONGEST_COUNT): number[] {
  return forwards
    .map((f, i) => [f.duration_s, i] as const)
    .sort((a, b) => b[0] - a[0] || a[1] - b[1])
    .slice(0, count)
    .map(([, i]) => i);
}

/** One forward in words, for its bar's label and tooltip. */
export function describeForward(forward: EngineForward, offsetS: number): string {
  const ms = (forward.duration_s * 1000).toFixed(1);
  const tokens = `${forward.prompt_tokens} prompt + ${forward.decode_tokens} decode tokens`;
  const who = `${forward.sessions} run${forward.sessions === 1 ? "" : "s"} of ${forward.accounts} account${forward.accounts === 1 ? "" : "s"}`;
  return `at +${offsetS.toFixed(3)} s: ${ms} ms, batch ${forward.batch_size}, ${tokens}, ${who}`;
}
