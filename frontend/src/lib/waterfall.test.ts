import { describe, expect, it } from "vitest";
import { span, SPANS } from "../test/traceFixtures";
import { formatSeconds, fullWindow, layoutRows, slowestOperations, tickStep, ticks, treeOrder, zoomWindow } from "./waterfall";

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
