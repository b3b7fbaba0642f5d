import { fireEvent, render, screen, within } from "@testing-library/react";
import { afterEach, describe, expect, it, vi } from "vitest";
import { mockApi } from "../test/mockApi";
import { EngineTimeline } from "./EngineTimeline";

const FORWARDS = [
  { start: 100, duration_s: 0.1, batch_size: 4, prompt_tokens: 0, decode_tokens: 4, sessions: 4, accounts: 1, tokens_per_account: { u1: 4 } },
  { start: 100.5, duration_s: 0.5, batch_size: 1, prompt_tokens: 300, decode_tokens: 0, sessions: 1, accounts: 1, tokens_per_account: { u2: 300 } },
];
const PATH = "/api/v1/staff/workers/gpu%200/timeline";

afterEach(() => vi.unstubAllGlobals());

describe("EngineTimeline", () => {
  it("asks the worker only when shown, then draws its forwards and the busy share", async () => {
    const { calls } = mockApi({ [`GET ${PATH}`]: { worker: "gpu 0", capacity: 2048, recorded: 9, forwards: FORWARDS } });
    render(<EngineTimeline worker="gpu 0" />);
    expect(calls).toHaveLength(0);
    expect(screen.getByRole("link", { name: "Chrome trace for Perfetto" }).getAttribute("href")).toBe(`${PATH}?format=chrome`);
    fireEvent.click(screen.getByRole("button", { name: "Show" }));
    const strip = await screen.findByRole("list", { name: "Forwards of worker gpu 0, oldest first" });
    const bars = within(strip).getAllByRole("listitem");
    expect(bars).toHaveLength(2);
    expect(bars[1].getAttribute("aria-label")).toBe("at +0.500 s: 500.0 ms, batch 1, 300 prompt + 0 decode tokens, 1 run of 1 account");
    expect(bars[1].className).toContain("et-prefill");
    expect(screen.getByTestId("engine-busy").textContent).toBe("60%");
    expect(screen.getByTestId("engine-timeline-summary").textContent).toContain("2 of 9 (keeps 2,048)");
    expect(screen.getByTestId("engine-longest").textContent).toMatch(/^Longest forwards: at \+0\.500 s: 500\.0 ms/);
    expect(screen.getByRole("button", { name: "Refresh" })).toBeTruthy();
  });
  it("says when the worker has run nothing yet", async () => {
    mockApi({ [`GET ${PATH}`]: { worker: "gpu 0", capacity: 2048, recorded: 0, forwards: [] } });
    render(<EngineTimeline worker="gpu 0" />);
    fireEvent.click(screen.getByRole("button", { name: "Show" }));
    expect(await screen.findByText("This worker has run no forward since it started.")).toBeTruthy();
  });
  it("shows the API's error when the worker cannot be asked", async () => {
    mockApi({ [`GET ${PATH}`]: () => ({ status: 503, body: { error: { code: "worker_unavailable", message: "the worker did not answer", detail: null } } }) });
    render(<EngineTimeline worker="gpu 0" />);
    fireEvent.click(screen.getByRole("button", { name: "Show" }));
    expect(await screen.findByText(/the worker did not answer/)).toBeTruthy();
  });
});
