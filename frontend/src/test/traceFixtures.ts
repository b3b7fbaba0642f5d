// A small trace of the shape a real run has, for the waterfall's tests.
import type { RunTraceSpan } from "../api/types";

export function span(id: number, parent: number | null, name: string, kind: string, start: number, end: number, attrs = {}): RunTraceSpan {
  return { id, parent, name, kind, start_s: start, end_s: end, duration_s: end - start, attrs };
}

// The shape of a real run's trace: run > queued, execute > (sandbox.start, worker.session >
// pred, sleep, pred), end. Listed out of order, as nothing promises the server's order.
export const SPANS = [
  span(1, null, "run", "run", 0, 4),
  span(6, 5, "sleep", "io", 1.5, 3.0),
  span(3, 1, "execute", "control", 0.5, 3.9),
  span(2, 1, "queued", "control", 0, 0.5),
  span(5, 3, "worker.session", "worker", 0.8, 3.8),
  span(4, 3, "sandbox.start", "sandbox", 0.5, 0.8, { warm: true }),
  span(7, 5, "pred", "syscall", 1.0, 1.4),
  span(8, 5, "pred", "syscall", 3.0, 3.2),
  span(9, 1, "end", "control", 4, 4),
];
