import { act, fireEvent, render, screen, waitFor, within } from "@testing-library/react";
import { afterEach, describe, expect, it, vi } from "vitest";
import { SPANS } from "../test/traceFixtures";
import { mockApi } from "../test/mockApi";
import { TraceWaterfall, Waterfall } from "./TraceWaterfall";

const RUN = "5f0c2b8e-0000-4000-8000-000000000001";
const TRACE = { run: RUN, status: "succeeded", created_at: "2026-01-01T00:00:00Z", complete: true, worker_tracing: "on" as const, spans_kept: 200, dropped: 0, children_left_out: 0, spans: SPANS };

afterEach(() => vi.unstubAllGlobals());

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

describe("TraceWaterfall", () => {
  it("says the trace comes at the run's end, and asks for nothing while it runs", () => {
    const { calls } = mockApi({});
    render(<TraceWaterfall runId={RUN} finished={false} />);
    expect(screen.getByTestId("trace").textContent).toContain("appears here when the run has ended");
    expect(screen.queryByTestId("trace-download")).toBeNull();
    expect(calls).toHaveLength(0);
  });
  it("draws an ended run's trace and links the Chrome format", async () => {
    mockApi({ [`GET /api/v1/runs/${RUN}/trace`]: TRACE });
    render(<TraceWaterfall runId={RUN} finished />);
    await screen.findByRole("list", { name: /Spans of the run/ });
    const link = screen.getByRole("link", { name: "Download trace (Chrome format)" });
    expect(link.getAttribute("href")).toBe(`/api/v1/runs/${RUN}/trace?format=chrome`);
    expect(screen.queryByTestId("trace-off")).toBeNull();
  });
  it("says tracing was off on the worker, and still draws the control plane's marks", async () => {
    const marks = SPANS.filter((s) => !["syscall", "io"].includes(s.kind));
    mockApi({ [`GET /api/v1/runs/${RUN}/trace`]: { ...TRACE, worker_tracing: "off", spans: marks } });
    render(<TraceWaterfall runId={RUN} finished />);
    const list = await screen.findByRole("list", { name: /Spans of the run/ });
    expect(within(list).getAllByRole("listitem")).toHaveLength(marks.length);
    expect(screen.getByTestId("trace-off").textContent).toContain("Tracing was off on this run's worker");
  });
  it("says so when the run has no recorded trace", async () => {
    vi.useFakeTimers({ shouldAdvanceTime: true });
    try {
      mockApi({ [`GET /api/v1/runs/${RUN}/trace`]: { ...TRACE, complete: false, spans: SPANS.slice(0, 2) } });
      render(<TraceWaterfall runId={RUN} finished />);
      await act(() => vi.advanceTimersByTimeAsync(10000));
      await waitFor(() => expect(screen.getByTestId("trace").textContent).toContain("No trace was recorded for this run."));
      expect(screen.queryByTestId("trace-download")).toBeNull();
    } finally {
      vi.useRealTimers();
    }
  });
});
