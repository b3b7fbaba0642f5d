// The console's first minutes, runs that update, errors in words, phones (see also tests/browser/).
import { fireEvent, render, screen, waitFor, within } from "@testing-library/react";
import { describe, expect, it } from "vitest";
import { App } from "../App";
import { ApiError, errorMessage, fieldError } from "../api/errors";
import type { Run } from "../api/types";
import { FileDrop } from "../components/FileDrop";
import { eventTime } from "../hooks/useRunEvents";
import { ME, mockApi, page } from "../test/mockApi";
import { MemoryRouter } from "react-router";
import { renderAt } from "../test/render";
import { firstTokenSeconds, RunTree } from "./RunPage";

const PROGRAM = { id: 3, name: "completion-example", description: "", default_args: { prompt: "The capital of France is", max_tokens: 24 }, created_at: "2026-01-01T00:00:00Z", latest_version: 1 };
const VERSION = { number: 1, kind: "py", sha256: "ab".repeat(32), size: 40, created_at: "2026-01-01T00:00:00Z" };
const RUN: Run = {
  id: "0f0e0d0c-0000-4000-8000-000000000001", program: 3, program_name: "completion-example", version: 1, status: "running", args: {}, limits: {},
  result: null, error: "", exit_code: null, worker: "local", created_at: "2026-01-01T00:00:00Z", started_at: "2026-01-01T00:00:01Z", finished_at: null,
  usage: null, timings: { queue_wait_s: 1, run_s: null, time_to_first_token_s: null }, parent: null, depth: 0, entry: "", children: [], cancelled_by: null, name: "",
};
const TOO_MANY = { error: { code: "invalid", message: "request failed", detail: { limits: { max_tokens: ["can be at most 4,096 tokens on this tenant's plan"] } } } };

describe("errors in words", () => {
  it("says a nested field's message as a sentence and finds it by path", () => {
    const err = new ApiError(400, "invalid", "request failed", TOO_MANY.error.detail);
    expect(errorMessage(err)).toBe("Max tokens can be at most 4,096 tokens on this tenant's plan.");
    expect(fieldError(err, "limits", "max_tokens")).toBe("Max tokens can be at most 4,096 tokens on this tenant's plan.");
    expect(fieldError(err, "args")).toBeNull();
    const password = new ApiError(400, "invalid", "request failed", { password: ["This password is too common."] });
    expect(fieldError(password, "password")).toBe("This password is too common.");
  });

  it("shows a plan limit next to the Max tokens field", async () => {
    mockApi({
      "GET /api/v1/auth/me": ME,
      "GET /api/v1/programs/3": PROGRAM,
      "GET /api/v1/programs/3/versions": [VERSION],
      "GET /api/v1/programs/3/versions/1/source": "x = 1\n",
      "GET /api/v1/runs": page([]),
      "POST /api/v1/runs": () => ({ status: 400, body: TOO_MANY }),
    });
    renderAt(<App />, "/programs/3");
    const args = (await screen.findByLabelText(/Arguments/)) as HTMLTextAreaElement;
    expect(JSON.parse(args.value)).toEqual(PROGRAM.default_args); // the declared example, not {}
    fireEvent.change(screen.getByLabelText("Max tokens"), { target: { value: "100000" } });
    fireEvent.click(screen.getByRole("button", { name: "Run program" }));
    const input = screen.getByLabelText("Max tokens");
    await waitFor(() => expect(input.getAttribute("aria-invalid")).toBe("true"));
    const described = document.getElementById("run-max-tokens-error");
    expect(described?.textContent).toBe("Max tokens can be at most 4,096 tokens on this tenant's plan.");
    expect(screen.getByText("Please fix the fields marked below.")).toBeTruthy();
  });

  it("refuses a file over the upload limit before sending it", () => {
    let chosen: File | null = null;
    render(<FileDrop file={null} onFile={(f) => (chosen = f)} maxBytes={1024 * 1024} />);
    const big = new File([new Uint8Array(1024 * 1024 + 1)], "big.py", { type: "text/x-python" });
    fireEvent.drop(screen.getByTestId("dropzone"), { dataTransfer: { files: [big] } });
    expect(chosen).toBeNull();
    expect(screen.getByRole("alert").textContent).toMatch(/^big\.py is 1(\.0)? MiB; programs can be at most 1(\.0)? MiB\.$/);
  });
});

describe("run trees", () => {
  it("links a spawned run to its parent and a parent to its children", () => {
    const child = { id: "0f0e0d0c-0000-4000-8000-0000000000c1", status: "succeeded", entry: "agents.scout:main" };
    render(
      <MemoryRouter>
        <RunTree run={{ ...RUN, children: [child, { ...child, id: "0f0e0d0c-0000-4000-8000-0000000000c2", entry: "", status: "failed" }] }} />
      </MemoryRouter>,
    );
    const list = screen.getByTestId("run-children");
    const hrefs = within(list).getAllByRole("link").map((a) => a.getAttribute("href"));
    expect(hrefs).toEqual([`/runs/${child.id}`, "/runs/0f0e0d0c-0000-4000-8000-0000000000c2"]);
    expect(within(list).getByText("agents.scout:main")).toBeTruthy();
    expect(within(list).getByText("main")).toBeTruthy();
  });

  it("shows who spawned a child, and nothing for a run outside any tree", () => {
    const { unmount } = render(
      <MemoryRouter>
        <RunTree run={{ ...RUN, parent: "0f0e0d0c-0000-4000-8000-0000000000aa", depth: 1, entry: "self:helper" }} />
      </MemoryRouter>,
    );
    expect(screen.getByRole("link", { name: "run 0f0e0d0c" }).getAttribute("href")).toBe("/runs/0f0e0d0c-0000-4000-8000-0000000000aa");
    expect(screen.getByText(/entry self:helper/)).toBeTruthy();
    unmount();
    render(<MemoryRouter><RunTree run={RUN} /></MemoryRouter>);
    expect(screen.queryByTestId("run-tree")).toBeNull();
  });
});

describe("runs you can follow", () => {
  it("lists runs by their program's name and filters by status and program", async () => {
    const { calls } = mockApi({
      "GET /api/v1/auth/me": ME,
      "GET /api/v1/programs": page([PROGRAM]),
      "GET /api/v1/runs": page([RUN]),
    });
    renderAt(<App />, "/runs");
    const table = await screen.findByRole("table", { name: "Runs" });
    expect(within(table).getByRole("link", { name: "completion-example" })).toBeTruthy();
    const before = calls.filter((c) => c.path === "/api/v1/runs").length;
    fireEvent.change(screen.getByLabelText("Status"), { target: { value: "failed" } });
    await waitFor(() => expect(calls.filter((c) => c.path === "/api/v1/runs").length).toBeGreaterThan(before));
    expect((screen.getByLabelText("Status") as HTMLSelectElement).value).toBe("failed");
    await screen.findByRole("option", { name: "completion-example" });
    fireEvent.change(screen.getByLabelText("Program"), { target: { value: "3" } });
    await waitFor(() => expect((screen.getByLabelText("Program") as HTMLSelectElement).value).toBe("3"));
  });

  it("times the first token by the server's clocks, the same live and replayed", () => {
    expect(eventTime("1767225601980-0")).toBe(1767225601980);
    expect(firstTokenSeconds(RUN, Date.parse("2026-01-01T00:00:01Z") + 980)).toBeCloseTo(1.98);
    expect(firstTokenSeconds(RUN, null)).toBeNull();
    // Once the server has recorded it, its figure is the one shown.
    const recorded = { ...RUN, timings: { queue_wait_s: 1, run_s: 3, time_to_first_token_s: 2.4 } };
    expect(firstTokenSeconds(recorded, Date.parse("2026-01-01T00:00:02.480Z"))).toBe(2.4);
  });

  it("shows a failed run's traceback as printed, with a copy button", async () => {
    const tb = 'Traceback (most recent call last):\n  File "main.py", line 3, in main\n    1 / 0\nZeroDivisionError: division by zero';
    mockApi({
      "GET /api/v1/auth/me": ME,
      [`GET /api/v1/runs/${RUN.id}`]: { ...RUN, status: "failed", error: tb, finished_at: "2026-01-01T00:00:02Z" },
      [`GET /api/v1/runs/${RUN.id}/logs`]: { id: RUN.id, status: "failed", stdout: "", stderr: "x", truncated: false },
    });
    renderAt(<App />, `/runs/${RUN.id}`);
    const box = await screen.findByTestId("run-error");
    expect(within(box).getByText("ZeroDivisionError: division by zero")).toBeTruthy();
    expect(screen.getByTestId("run-traceback").textContent).toBe(tb);
    expect(within(box).getByRole("button", { name: "Copy error" })).toBeTruthy();
  });

  it("asks again for a cancelled run's exit code, recorded a moment after the cancel", async () => {
    let asked = 0;
    const cancelled = { ...RUN, status: "cancelled", finished_at: "2026-01-01T00:00:02Z" };
    mockApi({
      "GET /api/v1/auth/me": ME,
      [`GET /api/v1/runs/${RUN.id}`]: () => ({ body: ++asked < 2 ? cancelled : { ...cancelled, exit_code: -9 } }),
      [`GET /api/v1/runs/${RUN.id}/logs`]: { id: RUN.id, status: "cancelled", stdout: "x", stderr: "", truncated: false },
    });
    renderAt(<App />, `/runs/${RUN.id}`);
    expect(await screen.findByText("-9", {}, { timeout: 5000 })).toBeTruthy();
    expect(asked).toBeGreaterThanOrEqual(2);
  });
});

describe("staff", () => {
  it("sends staff without a tenant to the staff page", async () => {
    mockApi({
      "GET /api/v1/auth/me": { user: { id: 1, email: "admin@localhost", is_staff: true }, tenants: [], active_tenant: null },
      "GET /api/v1/admin/kv-files": page([]),
      "GET /api/v1/admin/tenants": [],
      "GET /api/v1/admin/plans": { plans: ["free"] },
      "GET /api/v1/health": { status: "ok", checks: {} },
    });
    renderAt(<App />, "/programs");
    expect(await screen.findByRole("heading", { level: 1, name: "Staff" })).toBeTruthy();
    expect(screen.queryByRole("heading", { name: "No tenant" })).toBeNull();
  });
});
