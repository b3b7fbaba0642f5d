import { fireEvent, render, screen, within } from "@testing-library/react";
import { describe, expect, it } from "vitest";
import type { RunTraceSpan } from "../api/types";
import { Waterfall } from "../components/TraceWaterfall";
import { formatSeconds, fullWindow, layoutRows, slowestOperations, tickStep, ticks, treeOrder, zoomWindow } from "./waterfall";

function span(id: number, parent: number | null, name: string, kind: string, start: number, end: number, attrs = {}): RunTraceSpan {
  return { id, parent, name, kind, start_s: start, end_s: end, duration_s: end - start, attrs };
}

// The shape of a real run's trace: run > queued, execute > (sandbox.start, worker.session >
// pred, sleep, pred), end. Listed out of order, as nothing promises the server's order.
const SPANS = [
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

describe("waterfall layout", () => {
  it("orders spans as a tree, children by start, with their depth", () => {
    expect(treeOrder(SPANS).map(({ span: s, depth }) => `${depth}:${s.id}`)).toEqual([
      "0:1", "1:2", "1:3", "2:4", "2:5", "3:7", "3:6", "3:8", "1:9",
    ]);
  });
  it("treats a span whose parent is missing as a root", () => {
    expect(treeOrder([span(4, 99, "orphan", "io", 0, 1)])).toEqual([{ span: expect.objectContaining({ id: 4 }), depth: 0 }]);
  });
  it("ranks the program's operations by time, not the phases that enclose them", () => {
    expect(slowestOperations(SPANS)).toEqual([6, 7, 8]);
    expect(slowestOperations(SPANS, 1)).toEqual([6]);
  });
  it("places bars in percent of the whole run", () => {
    const rows = layoutRows(SPANS, fullWindow(SPANS));
    const sleep = rows.find((r) => r.span.id === 6)!;
    expect(sleep.left).toBeCloseTo(37.5);
    expect(sleep.width).toBeCloseTo(37.5);
    expect(sleep.slowRank).toBe(1);
    expect(rows.find((r) => r.span.name === "run")!.width).toBeCloseTo(100);
    expect(rows.find((r) => r.span.name === "end")).toMatchObject({ left: 100, width: 0, slowRank: null });
  });
  it("zooms to a span: only overlapping spans, clipped to the window", () => {
    const sleep = SPANS.find((s) => s.id === 6)!;
    const view = zoomWindow(sleep);
    expect(view.start).toBeCloseTo(1.425);
    expect(view.end).toBeCloseTo(3.075);
    const rows = layoutRows(SPANS, view);
    expect(rows.map((r) => r.span.id)).toEqual([1, 3, 5, 6, 8]);
    const run = rows[0];
    expect(run.left).toBe(0);
    expect(run.width).toBe(100);
    const zoomedSleep = rows.find((r) => r.span.id === 6)!;
    expect(zoomedSleep.left).toBeCloseTo((0.075 / 1.65) * 100);
    expect(zoomedSleep.width).toBeCloseTo((1.5 / 1.65) * 100);
    // A span of no length still gets a window to zoom into.
    const end = zoomWindow(SPANS.find((s) => s.id === 9)!);
    expect(end.end - end.start).toBeGreaterThan(0);
  });
  it("cuts the axis into nice steps", () => {
    expect(tickStep(4)).toBe(1);
    expect(tickStep(1.65)).toBe(0.5);
    expect(tickStep(0.012)).toBe(0.005);
    expect(ticks({ start: 0, end: 4 }).map((t) => t.t)).toEqual([0, 1, 2, 3, 4]);
    expect(ticks({ start: 1.425, end: 3.075 }).map((t) => t.t)).toEqual([1.5, 2, 2.5, 3]);
    expect(ticks({ start: 0, end: 4 })[2].at).toBeCloseTo(50);
  });
  it("writes durations in readable units", () => {
    expect(formatSeconds(0)).toBe("0 s");
    expect(formatSeconds(0.000042)).toBe("42 µs");
    expect(formatSeconds(0.0123)).toBe("12.3 ms");
    expect(formatSeconds(1.5)).toBe("1.5 s");
  });
});

describe("Waterfall", () => {
  it("highlights the slowest operation, zooms on a click and resets", () => {
    render(<Waterfall spans={SPANS} />);
    const list = screen.getByRole("list", { name: /Spans of the run/ });
    expect(within(list).getAllByRole("listitem")).toHaveLength(SPANS.length);
    const sleep = screen.getByRole("button", { name: /^sleep, 1\.5 s, .*slowest operation number 1/ });
    fireEvent.click(sleep);
    expect(screen.getByTestId("trace-window").textContent).toContain("Zoomed to sleep");
    expect(within(list).getAllByRole("listitem")).toHaveLength(5);
    expect(sleep.getAttribute("aria-current")).toBe("true");
    fireEvent.click(screen.getByRole("button", { name: "Show the whole run" }));
    expect(within(list).getAllByRole("listitem")).toHaveLength(SPANS.length);
  });
  it("moves between rows with the arrow keys and resets the zoom with Escape", () => {
    render(<Waterfall spans={SPANS} />);
    const rows = screen.getAllByRole("button", { name: /, from / });
    rows[0].focus();
    fireEvent.keyDown(rows[0], { key: "ArrowDown" });
    expect(document.activeElement).toBe(rows[1]);
    fireEvent.keyDown(rows[1], { key: "End" });
    expect(document.activeElement).toBe(rows[rows.length - 1]);
    fireEvent.click(rows[1]);
    expect(screen.getByTestId("trace-window").textContent).toContain("Zoomed to queued");
    fireEvent.keyDown(rows[1], { key: "Escape" });
    expect(screen.getByTestId("trace-window").textContent).toContain("Whole run");
  });
});
