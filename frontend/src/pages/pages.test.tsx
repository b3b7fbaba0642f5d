import { fireEvent, screen, waitFor, within, act } from "@testing-library/react";
import { describe, expect, it, vi } from "vitest";
import { App } from "../App";
import type { Run } from "../api/types";
import { ME, mockApi, page } from "../test/mockApi";
import { renderAt } from "../test/render";
import { validity } from "./PasswordResetPages";

const PROGRAM = { id: 3, name: "hello", description: "demo", default_args: { prompt: "hi" }, created_at: "2026-01-01T00:00:00Z", latest_version: 1 };
const VERSION = { number: 1, kind: "py", sha256: "ab".repeat(32), size: 40, created_at: "2026-01-01T00:00:00Z" };
const RUN: Run = {
  id: "0f0e0d0c-0000-4000-8000-000000000001", program: 3, program_name: "hello", version: 1, status: "running", args: {}, limits: {},
  result: null, error: "", exit_code: null, worker: "local", created_at: "2026-01-01T00:00:00Z", started_at: "2026-01-01T00:00:01Z", finished_at: null,
  usage: null, timings: { queue_wait_s: 1, run_s: null, time_to_first_token_s: null }, parent: null, depth: 0, entry: "", children: [], cancelled_by: null, name: "",
};
const USAGE = {
  prefill_tokens: 1200, cached_tokens: 64, decode_tokens: 42, pred_calls: 43, forwards: 40, page_seconds: 3.5, sandbox_seconds: 2.25,
  io_calls: 0, streamed_events: 42, streamed_bytes: 2048, cost: { currency: "USD", total: "0.000201", lines: { decode_tokens: "0.000017" } },
};

describe("auth", () => {
  it("sends an anonymous visitor to the login page and logs in", async () => {
    let loggedIn = false;
    const { calls } = mockApi({
      "GET /api/v1/auth/me": () => (loggedIn ? { body: ME } : { status: 403, body: { error: { code: "not_authenticated", message: "no", detail: null } } }),
      "GET /api/v1/auth/csrf": { csrftoken: "t" },
      "POST /api/v1/auth/login": () => {
        loggedIn = true;
        return { body: ME };
      },
      "GET /api/v1/programs": page([]),
    });
    renderAt(<App />, "/programs");
    expect(await screen.findByRole("heading", { name: "Log in" })).toBeTruthy();
    fireEvent.change(screen.getByLabelText("Email or username"), { target: { value: "ada@example.com" } });
    fireEvent.change(screen.getByLabelText("Password"), { target: { value: "pw-12345678" } });
    fireEvent.click(screen.getByRole("button", { name: "Log in" }));
    expect(await screen.findByRole("heading", { name: "Programs" })).toBeTruthy();
    expect(calls.find((c) => c.path === "/api/v1/auth/login")?.body).toEqual({ email: "ada@example.com", password: "pw-12345678" });
    expect(screen.queryByRole("link", { name: "Staff" })).toBeNull();
  });

  it("shows the server's message when sign-up fails", async () => {
    mockApi({
      "GET /api/v1/auth/me": () => ({ status: 403, body: {} }),
      "GET /api/v1/auth/csrf": { csrftoken: "t" },
      "POST /api/v1/auth/signup": () => ({ status: 409, body: { error: { code: "exists", message: "email already registered", detail: null } } }),
    });
    renderAt(<App />, "/signup");
    await screen.findByRole("heading", { name: "Create an account" });
    fireEvent.change(screen.getByLabelText("Email"), { target: { value: "a@b.co" } });
    fireEvent.change(screen.getByLabelText(/Password/), { target: { value: "pw-12345678" } });
    fireEvent.change(screen.getByLabelText(/tenant/), { target: { value: "Acme" } });
    fireEvent.click(screen.getByRole("button", { name: "Sign up" }));
    expect((await screen.findByRole("alert")).textContent).toContain("email already registered");
  });

  it("tells an unverified sign-up to check its inbox and resends the link", async () => {
    const unverified = { ...ME, user: { ...ME.user, email_verified: false } };
    const { calls } = mockApi({
      "GET /api/v1/auth/me": unverified,
      "GET /api/v1/auth/csrf": { csrftoken: "t" },
      "GET /api/v1/programs": page([]),
      "POST /api/v1/auth/verify-email/resend": { detail: "a new verification link is on its way to ada@example.com", sent: true },
    });
    renderAt(<App />, "/programs");
    const banner = await screen.findByTestId("verify-email-banner");
    expect(banner.textContent).toContain("Check your inbox to verify ada@example.com");
    fireEvent.click(within(banner).getByRole("button", { name: "Resend" }));
    expect(await within(banner).findByText("a new verification link is on its way to ada@example.com")).toBeTruthy();
    expect(calls.some((c) => c.path === "/api/v1/auth/verify-email/resend")).toBe(true);
  });

  it("verifies the address through the mailed link", async () => {
    const { calls } = mockApi({
      "GET /api/v1/auth/me": ME,
      "GET /api/v1/auth/csrf": { csrftoken: "t" },
      "POST /api/v1/auth/verify-email": { email: "ada@example.com", email_verified: true },
    });
    renderAt(<App />, "/verify-email/tok-1");
    expect(await screen.findByText(/ada@example.com is verified/)).toBeTruthy();
    expect(calls.find((c) => c.path === "/api/v1/auth/verify-email")?.body).toEqual({ token: "tok-1" });
  });

  it("switches tenant when the user has several", async () => {
    const two = { ...ME, tenants: [...ME.tenants, { id: 8, name: "Beta", slug: "beta", role: "member" }] };
    const { calls } = mockApi({
      "GET /api/v1/auth/me": two,
      "POST /api/v1/auth/switch-tenant": { ...two, active_tenant: 8 },
      "GET /api/v1/programs": page([]),
    });
    renderAt(<App />, "/programs");
    const select = (await screen.findByLabelText("Tenant")) as HTMLSelectElement;
    fireEvent.change(select, { target: { value: "8" } });
    await waitFor(() => expect(select.value).toBe("8"));
    expect(calls.find((c) => c.path === "/api/v1/auth/switch-tenant")?.body).toEqual({ tenant: 8 });
  });
});

/** What the page of program 3 loads. */
const PROGRAM_PAGE = {
  "GET /api/v1/auth/me": ME,
  "GET /api/v1/programs/3": PROGRAM,
  "GET /api/v1/programs/3/versions": [VERSION],
  "GET /api/v1/programs/3/versions/1/source": "x = 1\n",
  "GET /api/v1/runs": page([]),
};

describe("programs", () => {
  it("uploads a dropped .py file as multipart and opens the program", async () => {
    const { calls } = mockApi({
      "GET /api/v1/auth/me": ME,
      "GET /api/v1/programs": page([]),
      "POST /api/v1/programs": () => ({ status: 201, body: PROGRAM }),
      "GET /api/v1/programs/3": PROGRAM,
      "GET /api/v1/programs/3/versions": [VERSION],
      "GET /api/v1/programs/3/versions/1/source": "def main(args):\n    return 'hi'\n",
      "GET /api/v1/runs": page([]),
    });
    const append = vi.spyOn(FormData.prototype, "append");
    renderAt(<App />, "/programs");
    await screen.findByText(/No programs yet/);
    const file = new File(["def main(args):\n    return 'hi'\n"], "hello.py", { type: "text/x-python" });
    fireEvent.drop(screen.getByTestId("dropzone"), { dataTransfer: { files: [file] } });
    expect((screen.getByLabelText("Name") as HTMLInputElement).value).toBe("hello");
    fireEvent.click(screen.getByRole("button", { name: "Upload" }));
    expect(await screen.findByRole("heading", { name: "hello" })).toBeTruthy();
    const upload = calls.find((c) => c.method === "POST" && c.path === "/api/v1/programs");
    expect(upload?.body).toBe("multipart");
    const fields = Object.fromEntries(append.mock.calls.map(([k, v]) => [k, v]));
    expect(fields.name).toBe("hello");
    expect((fields.file as File).name).toBe("hello.py");
    expect(await screen.findByText("def main(args):")).toBeTruthy();
  });

  it("refuses to start a run with non-object JSON args", async () => {
    const { calls } = mockApi(PROGRAM_PAGE);
    renderAt(<App />, "/programs/3");
    const args = await screen.findByLabelText(/Arguments/);
    fireEvent.change(args, { target: { value: "[1, 2]" } });
    fireEvent.click(screen.getByRole("button", { name: "Run program" }));
    expect((await screen.findByRole("alert")).textContent).toContain("must be a JSON object");
    expect(calls.some((c) => c.method === "POST" && c.path === "/api/v1/runs")).toBe(false);
  });
});

describe("deleting a program", () => {
  it("asks once, says its runs go too, and shows why the server refuses", async () => {
    let busy = true;
    const { calls } = mockApi({
      ...PROGRAM_PAGE,
      "GET /api/v1/programs": page([]),
      "DELETE /api/v1/programs/3": () =>
        busy
          ? { status: 409, body: { error: { code: "conflict", message: "program 'hello' has 1 run(s) not finished yet", detail: null } } }
          : { status: 204 },
    });
    renderAt(<App />, "/programs/3");
    fireEvent.click(await screen.findByRole("button", { name: "Delete" }));
    fireEvent.click(screen.getByRole("button", { name: "Delete it and its runs" }));
    expect((await screen.findByRole("alert")).textContent).toContain("not finished yet");
    busy = false;
    fireEvent.click(screen.getByRole("button", { name: "Delete" }));
    fireEvent.click(screen.getByRole("button", { name: "Delete it and its runs" }));
    expect(await screen.findByRole("heading", { name: "Programs" })).toBeTruthy();
    expect(calls.filter((c) => c.method === "DELETE")).toHaveLength(2);
  });
});

describe("API keys", () => {
  it("shows a new secret once with a copy button, then revokes by prefix", async () => {
    const keys = [{ id: 1, name: "ci", prefix: "abc123", scopes: ["runs"], created_at: "2026-01-01T00:00:00Z", expires_at: null, last_used_at: null, revoked_at: null as string | null }];
    const { calls } = mockApi({
      "GET /api/v1/auth/me": ME,
      "GET /api/v1/api-keys": () => ({ body: page(keys) }),
      "POST /api/v1/api-keys": () => ({ status: 201, body: { ...keys[0], secret: "sk_abc123_SECRET" } }),
      "DELETE /api/v1/api-keys/1": () => {
        keys[0] = { ...keys[0], revoked_at: "2026-01-02T00:00:00Z" };
        return { status: 204 };
      },
    });
    const writeText = vi.fn().mockResolvedValue(undefined);
    Object.defineProperty(navigator, "clipboard", { value: { writeText }, configurable: true });
    renderAt(<App />, "/api-keys");
    fireEvent.change(await screen.findByLabelText("Name"), { target: { value: "ci" } });
    fireEvent.click(screen.getByRole("checkbox", { name: "usage" }));
    fireEvent.click(screen.getByRole("button", { name: "Create key" }));
    expect((await screen.findByTestId("api-key-secret")).textContent).toBe("sk_abc123_SECRET");
    expect(calls.find((c) => c.method === "POST")?.body).toEqual({ name: "ci", scopes: ["programs", "runs", "kv"] });
    fireEvent.click(screen.getByRole("button", { name: "Copy secret" }));
    await waitFor(() => expect(writeText).toHaveBeenCalledWith("sk_abc123_SECRET"));
    fireEvent.click(screen.getByRole("button", { name: "I have stored it" }));
    expect(screen.queryByTestId("api-key-secret")).toBeNull();
    const row = screen.getByText("sk_abc123_…").closest("tr")!;
    fireEvent.click(within(row).getByRole("button", { name: "Revoke ci" }));
    fireEvent.click(within(row).getByRole("button", { name: "Revoke now" }));
    expect(await within(row).findByText("revoked")).toBeTruthy();
  });
});

class FakeEventSource {
  static last: FakeEventSource | null = null;
  listeners: Record<string, ((e: MessageEvent) => void)[]> = {};
  onopen: (() => void) | null = null;
  onerror: (() => void) | null = null;
  closed = false;
  constructor(public url: string) {
    FakeEventSource.last = this;
  }
  addEventListener(type: string, fn: (e: MessageEvent) => void) {
    (this.listeners[type] ??= []).push(fn);
  }
  removeEventListener(type: string, fn: (e: MessageEvent) => void) {
    this.listeners[type] = (this.listeners[type] ?? []).filter((f) => f !== fn);
  }
  close() {
    this.closed = true;
  }
  emit(type: string, data: unknown, id = "1-0") {
    for (const fn of this.listeners[type] ?? []) fn(new MessageEvent(type, { data: JSON.stringify(data), lastEventId: id }));
  }
}

describe("run view", () => {
  it("streams tokens and KV samples live, then shows the final status", async () => {
    FakeEventSource.last = null;
    vi.stubGlobal("EventSource", FakeEventSource);
    let current = RUN;
    mockApi({
      "GET /api/v1/auth/me": ME,
      [`GET /api/v1/runs/${RUN.id}`]: () => ({ body: current }),
      [`GET /api/v1/runs/${RUN.id}/logs`]: { id: RUN.id, status: "succeeded", stdout: "step 1\n", stderr: "", truncated: false },
    });
    renderAt(<App />, `/runs/${RUN.id}`);
    await screen.findByRole("heading", { name: /Run 0f0e0d0c/ });
    await waitFor(() => expect(FakeEventSource.last).not.toBeNull());
    const es = FakeEventSource.last!;
    expect(es.url).toBe(`/api/v1/runs/${RUN.id}/events`);
    act(() => {
      es.onopen?.();
      es.emit("token", { text: "Hello" });
      es.emit("token", { text: ", world" });
      es.emit("kv", { run_pages: 2, tenant_device_pages: 4, tenant_host_pages: 1, tokens: 37 });
    });
    expect(screen.getByTestId("token-stream").textContent).toBe("Hello, world");
    expect(screen.getByTestId("token-count").textContent).toBe("2");
    expect(screen.getByRole("img", { name: /KV pages over time/ })).toBeTruthy();
    expect(screen.getByTestId("kv-run-pages").textContent).toBe("2");
    expect(screen.getByTestId("kv-tenant-device").textContent).toBe("4");
    expect(screen.getByTestId("kv-latest").textContent).toContain("Tokens in this run's files37");
    // Only this run's and its tenant's own pages: the worker's totals are other tenants' business.
    const kvChart = screen.getByRole("img", { name: /KV pages over time/ }).getAttribute("aria-label") ?? "";
    expect(kvChart).toContain("This run's pages: 2, This tenant on device: 4");
    expect(kvChart).not.toContain("Device pages");
    expect(screen.getByTestId("run-usage").textContent).toContain("recorded when the run has ended");
    current = {
      ...RUN, status: "succeeded", result: "Hello, world", finished_at: "2026-01-01T00:00:03Z", usage: USAGE,
      timings: { queue_wait_s: 1, run_s: 2, time_to_first_token_s: 1.5 },
    };
    act(() => es.emit("end", { status: "succeeded", result: "Hello, world" }, "9-0"));
    expect(es.closed).toBe(true);
    await waitFor(() => expect(screen.getByTestId("run-status").textContent).toBe("succeeded"));
    expect(screen.queryByRole("button", { name: "Cancel run" })).toBeNull();
    // Once the row is terminal, the program's stdout/stderr are fetched and shown.
    expect((await screen.findByTestId("run-stdout")).textContent).toBe("step 1\n");
    expect(screen.getByTestId("run-stderr").textContent).toBe("(nothing)");
    // The server's usage and timings of the finished run.
    expect(screen.getByTestId("usage-cost").textContent).toBe("0.000201 USD");
    expect(screen.getByTestId("usage-prefill").textContent).toBe("1,200");
    expect(screen.getByTestId("usage-decode").textContent).toBe("42");
    expect(screen.getByTestId("first-token").textContent).toBe("1.50 s after the run was created");
    expect(screen.queryByTestId("usage-ttft")).toBeNull(); // one first-token figure per run
  });

  it("cancels a running run", async () => {
    vi.stubGlobal("EventSource", FakeEventSource);
    const { calls } = mockApi({
      "GET /api/v1/auth/me": ME,
      [`GET /api/v1/runs/${RUN.id}`]: RUN,
      [`POST /api/v1/runs/${RUN.id}/cancel`]: { ...RUN, status: "cancelled", finished_at: "2026-01-01T00:00:02Z" },
    });
    renderAt(<App />, `/runs/${RUN.id}`);
    fireEvent.click(await screen.findByRole("button", { name: "Cancel run" }));
    expect(calls.some((c) => c.path.endsWith("/cancel"))).toBe(false); // it asks first
    fireEvent.click(screen.getByRole("button", { name: "Cancel now" }));
    await waitFor(() => expect(screen.getByTestId("run-status").textContent).toBe("cancelled"));
    expect(calls.some((c) => c.path.endsWith("/cancel"))).toBe(true);
  });
});

describe("KV files, usage and admin", () => {
  const KV = { id: 5, tenant: "acme", worker: "local", name: "sys-prompt", tokens: 512, bytes: 2 * 1024 * 1024, residency: "host", pinned: false, last_used: "2026-01-01T00:00:00Z", synced_at: "2026-01-01T00:00:00Z" };

  it("pins a KV file and warns when the mirror is stale", async () => {
    const { calls } = mockApi({
      "GET /api/v1/auth/me": ME,
      "GET /api/v1/kv-files": () => ({ body: page([KV]), headers: { "X-Symphony-Stale": "1" } }),
      "POST /api/v1/kv-files/5/pin": { ...KV, pinned: true },
    });
    renderAt(<App />, "/kv-files");
    expect(await screen.findByText("sys-prompt")).toBeTruthy();
    expect(screen.getByText(/worker is unreachable/)).toBeTruthy();
    fireEvent.click(screen.getByRole("button", { name: "Pin sys-prompt" }));
    await waitFor(() => expect(calls.find((c) => c.path === "/api/v1/kv-files/5/pin")?.body).toEqual({ pinned: true }));
  });

  it("pages through a tenant's KV files", async () => {
    const files = Array.from({ length: 150 }, (_, i) => ({ ...KV, id: 100 + i, name: `doc-${i}` }));
    const { calls } = mockApi({
      "GET /api/v1/auth/me": ME,
      "GET /api/v1/kv-files": ({ search }: { search: URLSearchParams }) => {
        const offset = Number(search.get("offset")), limit = Number(search.get("limit"));
        return { body: { count: files.length, next: null, previous: null, results: files.slice(offset, offset + limit) } };
      },
    });
    renderAt(<App />, "/kv-files");
    expect(await screen.findByText("doc-0")).toBeTruthy();
    expect(screen.getByText("Files 1–100 of 150")).toBeTruthy();
    fireEvent.click(screen.getByRole("button", { name: "Next" }));
    expect(await screen.findByText("doc-149")).toBeTruthy();
    expect(screen.getByText("Files 101–150 of 150")).toBeTruthy();
    expect(screen.queryByText("doc-0")).toBeNull();
    expect(calls.filter((c) => c.path === "/api/v1/kv-files")).toHaveLength(2);
  });

  it("goes back a page when the last file of the last page is deleted", async () => {
    let files = Array.from({ length: 101 }, (_, i) => ({ ...KV, id: 100 + i, name: `doc-${i}` }));
    mockApi({
      "GET /api/v1/auth/me": ME,
      "GET /api/v1/kv-files": ({ search }: { search: URLSearchParams }) => {
        const offset = Number(search.get("offset")), limit = Number(search.get("limit"));
        return { body: { count: files.length, next: null, previous: null, results: files.slice(offset, offset + limit) } };
      },
      "DELETE /api/v1/kv-files/200": () => {
        files = files.filter((f) => f.id !== 200);
        return { status: 204 };
      },
    });
    renderAt(<App />, "/kv-files");
    fireEvent.click(await screen.findByRole("button", { name: "Next" }));
    fireEvent.click(await screen.findByRole("button", { name: "Delete doc-100" }));
    fireEvent.click(screen.getByRole("button", { name: "Confirm" }));
    expect(await screen.findByText("doc-0")).toBeTruthy();
    expect(screen.queryByText("Files 1–100 of 100")).toBeNull(); // one page again: no pager
  });

  it("renders usage, quota meters and invoice lines", async () => {
    const today = new Date().toISOString().slice(0, 10);
    mockApi({
      "GET /api/v1/auth/me": ME,
      "GET /api/v1/usage": ({ search }: { search: URLSearchParams }) => {
        const days = [{ day: today, runs: 2, prefill_tokens: 100, decode_tokens: 50, pred_calls: 60, page_seconds: 3, io_calls: 0 }];
        const usage = { runs: 1, prefill_tokens: 50, cached_tokens: 4321, decode_tokens: 25, sandbox_seconds: 2.4, kv_gib_hours: 0 };
        const groups =
          search.get("group_by") === "api_key"
            ? [
                { kind: "api_key", id: 4, name: "ci", prefix: "ab12", ...usage },
                { kind: "console", id: null, name: null, ...usage },
              ]
            : [{ kind: "program", id: 3, name: "hello", ...usage, runs: 2 }];
        return { body: search.has("group_by") ? { days, groups } : { days } };
      },
      "GET /api/v1/quota": {
        plan: "free",
        limits: { max_concurrent_runs: 2, max_tokens_per_run: 4096, max_run_seconds: 120, tokens_per_month: 1000000, max_device_pages_per_run: 256, kv_bytes_stored: 1 << 30, api_requests_per_minute: 600, kv_pinned_device_share: 0.1, max_kv_files: 100 },
        use: { active_runs: 1, tokens_this_month: 150, kv_bytes_stored: 1 << 20, account_kv_bytes_stored: 3 << 20, kv_files: 7, account_kv_files: 9 },
        allowed_tool_hosts: [],
      },
      "GET /api/v1/invoices": [{ id: "2026-01", period_start: "2026-01-01", period_end: "2026-02-01", runs: 2, currency: "USD", total: "0.01", lines: [{ item: "decode_tokens", description: "Decode tokens", quantity: "50", unit_price: "0.0000004", amount: "0.00" }] }],
    });
    renderAt(<App />, "/usage");
    expect((await screen.findByTestId("usage-totals")).textContent).toContain("150 tokens");
    expect(screen.getByRole("meter", { name: "Concurrent runs" }).getAttribute("aria-valuenow")).toBe("1");
    expect(screen.getByRole("meter", { name: "Tokens this month" }).getAttribute("aria-valuenow")).toBe("150");
    // The plan bounds the account's tenants together: the meter shows the account's bytes.
    expect(screen.getByRole("meter", { name: "KV bytes stored" }).getAttribute("aria-valuenow")).toBe(String(3 << 20));
    expect(screen.getByRole("meter", { name: "KV files" }).getAttribute("aria-valuenow")).toBe("9");
    expect(screen.getByText("Pinned KV files, share of a worker's device pool").nextElementSibling?.textContent).toBe("10%");
    expect(screen.getByText("120 s")).toBeTruthy();
    expect(screen.getByText("API requests per minute").nextElementSibling?.textContent).toBe("600");
    expect(screen.getByText("Decode tokens", { selector: "td" })).toBeTruthy();
    // Who used it: per program, then per API key (console runs on their own row).
    const byProgram = await screen.findByRole("table", { name: "Usage by program" });
    expect(within(byProgram).getByRole("row", { name: /hello/ }).textContent).toContain("2");
    expect(within(byProgram).getByRole("row", { name: /hello/ }).textContent).toContain("4,321");
    fireEvent.click(screen.getByRole("button", { name: "By API key" }));
    const byKey = await screen.findByRole("table", { name: "Usage by API key" });
    expect(await within(byKey).findByText("ci (sk_ab12_…)")).toBeTruthy();
    expect(within(byKey).getByText("Console (no API key)")).toBeTruthy();
  });

  it("hides the staff page from non-staff and lets staff evict, change plans and close tenants", async () => {
    const staff = { ...ME, user: { ...ME.user, is_staff: true } };
    const { calls } = mockApi({
      "GET /api/v1/auth/me": staff,
      "GET /api/v1/admin/kv-files": page([KV]),
      "POST /api/v1/admin/kv-files/5/evict": { evicted: true },
      "GET /api/v1/admin/tenants": [
        { id: 7, slug: "acme", name: "Acme", plan: "free", members: 1, programs: 2, active_runs: 0, closed_at: null, purged_at: null },
        { id: 8, slug: "gone", name: "Gone", plan: "free", members: 0, programs: 0, active_runs: 0, closed_at: "2026-01-02T00:00:00Z", purged_at: "2026-01-02T00:01:00Z" },
      ],
      "GET /api/v1/health": { status: "ok", checks: { database: "ok", redis: "ok" } },
      "GET /api/v1/admin/plans": { plans: ["free", "pro"] },
      "PATCH /api/v1/admin/tenants/7": { id: 7, slug: "acme", name: "Acme", plan: "pro", closed_at: null },
      "POST /api/v1/admin/tenants/7/close": { id: 7, slug: "acme", name: "Acme", plan: "free", closed_at: "2026-01-03T00:00:00Z" },
    });
    renderAt(<App />, "/staff");
    expect(await screen.findByRole("heading", { name: "Staff" })).toBeTruthy();
    fireEvent.change(await screen.findByLabelText("Plan of acme"), { target: { value: "pro" } });
    fireEvent.click(screen.getByRole("button", { name: "Change plan" }));
    expect(await screen.findByText("acme is on the pro plan now.")).toBeTruthy();
    expect(calls.find((c) => c.path === "/api/v1/admin/tenants/7" && c.method === "PATCH")?.body).toEqual({ plan: "pro" });
    fireEvent.click(screen.getByRole("button", { name: "Close acme" }));
    fireEvent.click(screen.getByRole("button", { name: "Close acme and delete its data" }));
    expect(await screen.findByText(/Closed acme/)).toBeTruthy();
    expect(calls.find((c) => c.path === "/api/v1/admin/tenants/7/close")?.body).toEqual({ confirm: "acme" });
    expect(screen.getByRole("link", { name: "Open acme in the Django admin" }).getAttribute("href")).toBe("/admin/api/tenant/7/change/");
    expect(await screen.findByText(/does not serve worker health yet/)).toBeTruthy();
    expect(screen.getByText("closed, data deleted")).toBeTruthy();
    expect(screen.getAllByText(/^closed/)).toHaveLength(1); // the open tenant has no badge
    fireEvent.click(await screen.findByRole("button", { name: "Evict acme/sys-prompt" }));
    fireEvent.click(screen.getByRole("button", { name: "Evict now" }));
    expect((await screen.findByText(/Evicted acme\/sys-prompt/)).textContent).toContain("stays on disk");
    expect(calls.some((c) => c.path === "/api/v1/admin/kv-files/5/evict")).toBe(true);
  });

  it("redirects non-staff away from /staff", async () => {
    mockApi({ "GET /api/v1/auth/me": ME, "GET /api/v1/programs": page([]) });
    renderAt(<App />, "/staff");
    expect(await screen.findByRole("heading", { name: "Programs" })).toBeTruthy();
  });
});

describe("team", () => {
  const ADA = { id: 11, user_id: 1, email: "ada@example.com", role: "owner", joined_at: "2026-01-01T00:00:00Z" };
  const BOB = { id: 12, user_id: 2, email: "bob@example.com", role: "member", joined_at: "2026-01-02T00:00:00Z" };
  const CAROL_INVITE = { id: 21, email: "carol@example.com", role: "owner", invited_by: "ada@example.com", created_at: "2026-01-03T00:00:00Z", expires_at: "2026-01-10T00:00:00Z" };
  const membersTable = () => screen.getByRole("table", { name: "Members" });
  const rowOf = (table: HTMLElement, email: string) => within(table).getByText(email, { exact: false, selector: "td" }).closest("tr")!;

  it("lets an owner invite (the link is shown once), see it pending and remove a member", async () => {
    let members = [ADA, BOB];
    let invitations: (typeof CAROL_INVITE)[] = [];
    const { calls } = mockApi({
      "GET /api/v1/auth/me": ME,
      "GET /api/v1/members": () => ({ body: page(members) }),
      "GET /api/v1/tool-hosts": { hosts: [], max_hosts: 8 },
      "GET /api/v1/invitations": () => ({ body: page(invitations) }),
      "POST /api/v1/invitations": () => {
        invitations = [CAROL_INVITE];
        return { status: 201, body: { ...CAROL_INVITE, token: "inv_SECRET", emailed: true } };
      },
      "DELETE /api/v1/members/12": () => {
        members = [ADA];
        return { status: 204 };
      },
      "GET /api/v1/audit-log": () => ({
        body: page(
          members.length === 1
            ? [
                { id: 31, actor: "ada@example.com", action: "member.remove", target: "bob@example.com", detail: { role: "member" }, created_at: "2026-01-04T00:00:00Z" },
                { id: 30, actor: null, action: "quota.notice", target: "tokens_per_month", detail: { percent: 80, used: 812345, limit: 1000000, period: "2026-01" }, created_at: "2026-01-03T00:00:00Z" },
              ]
            : [],
        ),
      }),
    });
    const writeText = vi.fn().mockResolvedValue(undefined);
    Object.defineProperty(navigator, "clipboard", { value: { writeText }, configurable: true });
    renderAt(<App />, "/team");
    await screen.findByText("bob@example.com");
    const ada = rowOf(membersTable(), "ada@example.com");
    expect(within(ada).getByText("you")).toBeTruthy();
    expect(within(ada).getByRole("button", { name: "Leave tenant" })).toBeTruthy();
    expect(within(ada).queryByRole("button", { name: /Remove/ })).toBeNull();
    expect((screen.getByRole("combobox", { name: "Role of bob@example.com" }) as HTMLSelectElement).value).toBe("member");
    expect(await screen.findByText("No pending invitations.")).toBeTruthy();

    fireEvent.change(screen.getByLabelText(/^Email/), { target: { value: "carol@example.com" } });
    fireEvent.change(screen.getByLabelText("Role"), { target: { value: "owner" } });
    fireEvent.click(screen.getByRole("button", { name: "Create invitation link" }));
    const link = `${window.location.origin}/invite/inv_SECRET`;
    expect((await screen.findByTestId("invite-link")).textContent).toBe(link);
    expect(screen.getByText(/shown only once/).textContent).toContain("expires 2026-01-10");
    expect(screen.getByTestId("invite-mail").textContent).toBe("We emailed this link to carol@example.com.");
    expect(calls.find((c) => c.method === "POST" && c.path === "/api/v1/invitations")?.body).toEqual({ email: "carol@example.com", role: "owner" });
    fireEvent.click(screen.getByRole("button", { name: "Copy link" }));
    await waitFor(() => expect(writeText).toHaveBeenCalledWith(link));
    expect(await screen.findByRole("button", { name: "Revoke invitation for carol@example.com" })).toBeTruthy();
    fireEvent.click(screen.getByRole("button", { name: "Done" }));
    expect(screen.queryByTestId("invite-link")).toBeNull(); // once dismissed, the token is gone for good

    fireEvent.click(screen.getByRole("button", { name: "Remove bob@example.com" }));
    fireEvent.click(screen.getByRole("button", { name: "Remove now" }));
    await waitFor(() => expect(within(membersTable()).queryByText("bob@example.com")).toBeNull());
    expect(calls.some((c) => c.method === "DELETE" && c.path === "/api/v1/members/12")).toBe(true);
    // The owner's activity log is re-read after the change and shows it.
    const activity = await screen.findByRole("table", { name: "Activity" });
    expect(within(activity).getByText("member.remove")).toBeTruthy();
    expect(within(activity).getByText("as member")).toBeTruthy();
    expect(within(activity).getByText("80% of the monthly tokens used (812,345 of 1,000,000); owners mailed")).toBeTruthy();
  });

  it("says when the invitation could not be mailed, and still shows the link", async () => {
    mockApi({
      "GET /api/v1/auth/me": ME,
      "GET /api/v1/members": page([ADA]),
      "GET /api/v1/tool-hosts": { hosts: [], max_hosts: 8 },
      "GET /api/v1/invitations": page([]),
      "GET /api/v1/audit-log": page([]),
      "POST /api/v1/invitations": () => ({ status: 201, body: { ...CAROL_INVITE, token: "inv_SECRET", emailed: false } }),
    });
    renderAt(<App />, "/team");
    fireEvent.change(await screen.findByLabelText(/^Email/), { target: { value: "carol@example.com" } });
    fireEvent.click(screen.getByRole("button", { name: "Create invitation link" }));
    expect((await screen.findByTestId("invite-link")).textContent).toBe(`${window.location.origin}/invite/inv_SECRET`);
    expect(screen.getByTestId("invite-mail").textContent).toBe("Mail could not be sent: pass the link on yourself.");
    expect(screen.queryByText(/We emailed/)).toBeNull();
  });

  it("gives a member no owner controls, and leaving without another tenant shows the no-tenant screen", async () => {
    const memberMe = { ...ME, tenants: [{ ...ME.tenants[0], role: "member" }] };
    const grace = { ...ADA, user_id: 2, email: "grace@example.com" };
    const self = { ...BOB, user_id: 1, email: "ada@example.com" };
    let left = false;
    const { calls } = mockApi({
      "GET /api/v1/auth/me": () => ({ body: left ? { user: ME.user, tenants: [], active_tenant: null } : memberMe }),
      "GET /api/v1/members": page([grace, self]),
      "GET /api/v1/tool-hosts": { hosts: [], max_hosts: 8 },
      "GET /api/v1/invitations": page([CAROL_INVITE]),
      "DELETE /api/v1/members/12": () => {
        left = true;
        return { status: 204 };
      },
    });
    renderAt(<App />, "/team");
    await screen.findByText("grace@example.com");
    expect(await screen.findByText("carol@example.com")).toBeTruthy(); // members see pending invitations…
    expect(screen.queryByRole("button", { name: /Revoke/ })).toBeNull(); // …but cannot revoke them
    expect(screen.queryByRole("heading", { name: "Invite someone" })).toBeNull();
    expect(screen.queryByRole("combobox")).toBeNull();
    expect(screen.queryByRole("button", { name: /Remove/ })).toBeNull();
    expect(screen.queryByRole("heading", { name: "Activity" })).toBeNull(); // the audit log is the owners'
    expect(calls.some((c) => c.path === "/api/v1/audit-log")).toBe(false);
    expect(within(rowOf(membersTable(), "grace@example.com")).getByText("owner")).toBeTruthy();
    expect(screen.queryByRole("heading", { name: "Close this tenant" })).toBeNull(); // closing is the owners'

    fireEvent.click(within(rowOf(membersTable(), "ada@example.com")).getByRole("button", { name: "Leave tenant" }));
    fireEvent.click(screen.getByRole("button", { name: "Leave now" }));
    expect(await screen.findByRole("heading", { name: "No tenant" })).toBeTruthy();
    expect(calls.some((c) => c.method === "DELETE" && c.path === "/api/v1/members/12")).toBe(true);
    expect(screen.queryByRole("link", { name: "Programs" })).toBeNull();
  });
});

describe("closing a tenant", () => {
  it("arms the button only once the slug is typed, then leaves the owner without the tenant", async () => {
    let closed = false;
    const { calls } = mockApi({
      "GET /api/v1/auth/me": () => ({ body: closed ? { user: ME.user, tenants: [], active_tenant: null } : ME }),
      "GET /api/v1/members": page([]),
      "GET /api/v1/tool-hosts": { hosts: [], max_hosts: 8 },
      "GET /api/v1/invitations": page([]),
      "GET /api/v1/audit-log": page([]),
      "POST /api/v1/tenants/7/close": () => {
        closed = true;
        return { body: { user: ME.user, tenants: [], active_tenant: null } };
      },
    });
    renderAt(<App />, "/team");
    expect(await screen.findByRole("heading", { name: "Close this tenant" })).toBeTruthy();
    const button = screen.getByRole("button", { name: "Close tenant" }) as HTMLButtonElement;
    const input = screen.getByLabelText(/to confirm/);
    expect(button.disabled).toBe(true);
    fireEvent.change(input, { target: { value: "Acme" } }); // the name is not the slug
    expect(button.disabled).toBe(true);
    fireEvent.change(input, { target: { value: "acme" } });
    expect(button.disabled).toBe(false);
    fireEvent.click(button);
    expect(await screen.findByRole("heading", { name: "No tenant" })).toBeTruthy();
    expect(calls.find((c) => c.path === "/api/v1/tenants/7/close")?.body).toEqual({ confirm: "acme" });
  });

  it("shows the server's refusal and stays on the page", async () => {
    mockApi({
      "GET /api/v1/auth/me": ME,
      "GET /api/v1/members": page([]),
      "GET /api/v1/tool-hosts": { hosts: [], max_hosts: 8 },
      "GET /api/v1/invitations": page([]),
      "GET /api/v1/audit-log": page([]),
      "POST /api/v1/tenants/7/close": () => ({
        status: 403,
        body: { error: { code: "permission_denied", message: "only an owner can close a tenant", detail: null } },
      }),
    });
    renderAt(<App />, "/team");
    fireEvent.change(await screen.findByLabelText(/to confirm/), { target: { value: "acme" } });
    fireEvent.click(screen.getByRole("button", { name: "Close tenant" }));
    expect((await screen.findByRole("alert")).textContent).toContain("only an owner can close a tenant");
    expect(screen.getByRole("heading", { name: "Team" })).toBeTruthy();
  });
});

describe("account", () => {
  it("checks that the new password is confirmed before sending it", async () => {
    const { calls } = mockApi({ "GET /api/v1/auth/me": ME, "POST /api/v1/auth/password": () => ({ status: 204 }) });
    renderAt(<App />, "/account");
    // The email card above has a "Current password" field too.
    const form = within(await screen.findByRole("form", { name: "Change password" }));
    fireEvent.change(form.getByLabelText("Current password"), { target: { value: "old-pass-123" } });
    fireEvent.change(form.getByLabelText(/^New password/), { target: { value: "new-pass-123" } });
    fireEvent.change(form.getByLabelText("Confirm new password"), { target: { value: "new-pass-124" } });
    fireEvent.click(form.getByRole("button", { name: "Change password" }));
    expect((await screen.findByRole("alert")).textContent).toContain("do not match");
    expect(calls.some((c) => c.path === "/api/v1/auth/password")).toBe(false);

    fireEvent.change(form.getByLabelText("Confirm new password"), { target: { value: "new-pass-123" } });
    fireEvent.click(form.getByRole("button", { name: "Change password" }));
    expect(await screen.findByText(/Password changed/)).toBeTruthy();
    expect(calls.find((c) => c.path === "/api/v1/auth/password")?.body).toEqual({ current_password: "old-pass-123", new_password: "new-pass-123" });
    expect(screen.queryByRole("alert")).toBeNull();
  });

  it("offers a user without a tenant to create one, then opens it", async () => {
    let me: unknown = { user: ME.user, tenants: [], active_tenant: null };
    const { calls } = mockApi({
      "GET /api/v1/auth/me": () => ({ body: me }),
      "POST /api/v1/tenants": () => {
        me = ME;
        return { status: 201, body: ME };
      },
      "GET /api/v1/programs": page([]),
    });
    renderAt(<App />, "/programs");
    expect(await screen.findByRole("heading", { name: "No tenant" })).toBeTruthy();
    expect(screen.queryByRole("link", { name: "Programs" })).toBeNull();
    fireEvent.change(screen.getByLabelText("Tenant name"), { target: { value: "Acme" } });
    fireEvent.click(screen.getByRole("button", { name: "Create tenant" }));
    expect(await screen.findByRole("heading", { name: "Programs" })).toBeTruthy();
    expect(calls.find((c) => c.path === "/api/v1/tenants")?.body).toEqual({ name: "Acme" });
    expect(screen.getByRole("link", { name: "Team" })).toBeTruthy();
  });
});

describe("invite link", () => {
  const TOKEN = "inv_abcDEF123";
  const PREVIEW = { tenant_name: "Beta", email: "ada@example.com", role: "member", invited_by: "grace@example.com", expires_at: "2026-01-10T00:00:00Z" };
  const JOINED = { ...ME, tenants: [...ME.tenants, { id: 8, name: "Beta", slug: "beta", role: "member" }], active_tenant: 8 };
  const anonymous = () => ({ status: 403, body: { error: { code: "not_authenticated", message: "no", detail: null } } });

  it("lets a signed-in user join and opens the tenant", async () => {
    const { calls } = mockApi({
      "GET /api/v1/auth/me": ME,
      [`GET /api/v1/auth/invitations/${TOKEN}`]: PREVIEW,
      [`POST /api/v1/auth/invitations/${TOKEN}/accept`]: JOINED,
      "GET /api/v1/programs": page([]),
    });
    renderAt(<App />, `/invite/${TOKEN}`);
    expect(await screen.findByRole("heading", { name: "Join Beta" })).toBeTruthy();
    expect(screen.getByText(/grace@example.com invited/)).toBeTruthy();
    fireEvent.click(screen.getByRole("button", { name: "Join Beta as member" }));
    expect(await screen.findByRole("heading", { name: "Programs" })).toBeTruthy();
    expect(calls.some((c) => c.method === "POST" && c.path === `/api/v1/auth/invitations/${TOKEN}/accept`)).toBe(true);
    expect((screen.getByLabelText("Tenant") as HTMLSelectElement).value).toBe("8");
  });

  it("says when the invitation is for another address and does not offer to join", async () => {
    mockApi({ "GET /api/v1/auth/me": ME, [`GET /api/v1/auth/invitations/${TOKEN}`]: { ...PREVIEW, email: "bob@example.com" } });
    renderAt(<App />, `/invite/${TOKEN}`);
    expect((await screen.findByText(/This invitation is for bob@example.com/)).textContent).toContain("signed in as ada@example.com");
    expect((screen.getByRole("button", { name: "Join Beta as member" }) as HTMLButtonElement).disabled).toBe(true);
  });

  it("signs up a visitor with the invitation instead of a new tenant", async () => {
    const { calls } = mockApi({
      "GET /api/v1/auth/me": anonymous,
      "GET /api/v1/auth/csrf": { csrftoken: "t" },
      [`GET /api/v1/auth/invitations/${TOKEN}`]: { ...PREVIEW, email: "carol@example.com" },
      "POST /api/v1/auth/signup": () => ({ status: 201, body: { ...JOINED, user: { ...ME.user, email: "carol@example.com" }, tenants: [JOINED.tenants[1]] } }),
      "GET /api/v1/programs": page([]),
    });
    renderAt(<App />, `/invite/${TOKEN}`);
    const email = (await screen.findByLabelText("Email")) as HTMLInputElement;
    expect(email.value).toBe("carol@example.com");
    fireEvent.change(screen.getByLabelText(/Password/), { target: { value: "pw-12345678" } });
    fireEvent.click(screen.getByRole("button", { name: "Sign up and join" }));
    expect(await screen.findByRole("heading", { name: "Programs" })).toBeTruthy();
    expect(calls.find((c) => c.path === "/api/v1/auth/signup")?.body).toEqual({ email: "carol@example.com", password: "pw-12345678", invite: TOKEN });
  });

  it("comes back to the invitation after logging in", async () => {
    let loggedIn = false;
    mockApi({
      "GET /api/v1/auth/me": () => (loggedIn ? { body: ME } : anonymous()),
      "GET /api/v1/auth/csrf": { csrftoken: "t" },
      "POST /api/v1/auth/login": () => {
        loggedIn = true;
        return { body: ME };
      },
      [`GET /api/v1/auth/invitations/${TOKEN}`]: PREVIEW,
    });
    renderAt(<App />, `/invite/${TOKEN}`);
    fireEvent.click(await screen.findByRole("link", { name: "Log in" }));
    fireEvent.change(await screen.findByLabelText("Email or username"), { target: { value: "ada@example.com" } });
    fireEvent.change(screen.getByLabelText("Password"), { target: { value: "pw-12345678" } });
    fireEvent.click(screen.getByRole("button", { name: "Log in" }));
    expect(await screen.findByRole("button", { name: "Join Beta as member" })).toBeTruthy();
  });

  it("explains an invalid or expired link", async () => {
    mockApi({
      "GET /api/v1/auth/me": anonymous,
      [`GET /api/v1/auth/invitations/${TOKEN}`]: () => ({ status: 404, body: { error: { code: "not_found", message: "no such invitation", detail: null } } }),
    });
    renderAt(<App />, `/invite/${TOKEN}`);
    expect((await screen.findByRole("alert")).textContent).toContain("not valid");
    expect(screen.queryByRole("button", { name: /Join|Sign up/ })).toBeNull();
  });
});

describe("password reset", () => {
  const anonymous = () => ({ status: 403, body: { error: { code: "not_authenticated", message: "no", detail: null } } });
  const UID = "MQ";
  const TOKEN = "cz1abc-0123456789abcdef0123456789abcdef";
  const resetUrl = `/api/v1/auth/password-reset/confirm`;

  it("links from the login page and mails a link, confirming without saying whether the account exists", async () => {
    let answer: { status: number; body: unknown } = {
      status: 503,
      body: { error: { code: "mail_unavailable", message: "mail cannot be sent right now; try again in a minute", detail: null } },
    };
    const { calls } = mockApi({ "GET /api/v1/auth/me": anonymous, "POST /api/v1/auth/password-reset": () => answer });
    renderAt(<App />, "/login");
    await screen.findByRole("heading", { name: "Log in" });
    fireEvent.change(screen.getByLabelText("Email or username"), { target: { value: "ada@example.com" } });
    fireEvent.click(screen.getByRole("link", { name: "Forgot your password?" }));
    expect(await screen.findByRole("heading", { name: "Reset your password" })).toBeTruthy();
    // What was typed on the login page comes along.
    expect((screen.getByLabelText("Email") as HTMLInputElement).value).toBe("ada@example.com");
    fireEvent.click(screen.getByRole("button", { name: "Send reset link" }));
    expect((await screen.findByRole("alert")).textContent).toContain("mail cannot be sent right now");

    answer = { status: 202, body: { detail: "if an account uses this email, a link to reset its password is on its way", valid_minutes: 60 } };
    fireEvent.click(screen.getByRole("button", { name: "Send reset link" }));
    const sent = await screen.findByText(/we sent a link/);
    expect(sent.textContent).toBe("If an account uses ada@example.com, we sent a link to reset its password. It is valid for an hour.");
    expect(screen.queryByRole("button", { name: "Send reset link" })).toBeNull();
    expect(screen.queryByRole("alert")).toBeNull();
    expect(calls.filter((c) => c.path === "/api/v1/auth/password-reset").map((c) => c.body)).toEqual([
      { email: "ada@example.com" },
      { email: "ada@example.com" },
    ]);
    fireEvent.click(screen.getByRole("link", { name: "Back to Log in" }));
    expect(await screen.findByRole("heading", { name: "Log in" })).toBeTruthy();
  });

  it("checks the new password on the page, then sets it and shows the login page with a notice", async () => {
    const { calls } = mockApi({ "GET /api/v1/auth/me": anonymous, [`POST ${resetUrl}`]: () => ({ status: 204 }) });
    renderAt(<App />, `/reset-password/${UID}/${TOKEN}`);
    const next = await screen.findByLabelText(/^New password/);
    const confirm = screen.getByLabelText("Confirm new password");
    const submit = screen.getByRole("button", { name: "Set new password" });

    fireEvent.change(next, { target: { value: "short" } });
    fireEvent.change(confirm, { target: { value: "short" } });
    fireEvent.click(submit);
    expect((await screen.findByRole("alert")).textContent).toContain("at least 8 characters");

    fireEvent.change(next, { target: { value: "new-pass-123" } });
    fireEvent.change(confirm, { target: { value: "new-pass-124" } });
    fireEvent.click(submit);
    await waitFor(() => expect(screen.getByRole("alert").textContent).toContain("do not match"));
    expect(calls.some((c) => c.path === resetUrl)).toBe(false);

    fireEvent.change(confirm, { target: { value: "new-pass-123" } });
    fireEvent.click(submit);
    expect(await screen.findByRole("heading", { name: "Log in" })).toBeTruthy();
    expect(screen.getByRole("status").textContent).toBe("Your password was changed. Log in with the new one.");
    expect(calls.find((c) => c.path === resetUrl)?.body).toEqual({ uid: UID, token: TOKEN, new_password: "new-pass-123", revoke_api_keys: true });
  });

  it("shows the validators' objections and keeps the form", async () => {
    mockApi({
      "GET /api/v1/auth/me": anonymous,
      [`POST ${resetUrl}`]: () => ({
        status: 400,
        body: { error: { code: "invalid", message: "request failed", detail: { new_password: ["This password is too common."] } } },
      }),
    });
    renderAt(<App />, `/reset-password/${UID}/${TOKEN}`);
    fireEvent.change(await screen.findByLabelText(/^New password/), { target: { value: "password1" } });
    fireEvent.change(screen.getByLabelText("Confirm new password"), { target: { value: "password1" } });
    fireEvent.click(screen.getByRole("button", { name: "Set new password" }));
    expect((await screen.findByRole("alert")).textContent).toContain("This password is too common.");
    expect(screen.getByRole("button", { name: "Set new password" })).toBeTruthy();
  });

  it("explains a used or expired link and offers to ask for a new one", async () => {
    const message = "this reset link is invalid, was already used or has expired: ask for a new one";
    mockApi({
      "GET /api/v1/auth/me": anonymous,
      [`POST ${resetUrl}`]: () => ({ status: 400, body: { error: { code: "invalid", message: "request failed", detail: { token: [message] } } } }),
    });
    renderAt(<App />, `/reset-password/${UID}/${TOKEN}`);
    fireEvent.change(await screen.findByLabelText(/^New password/), { target: { value: "new-pass-123" } });
    fireEvent.change(screen.getByLabelText("Confirm new password"), { target: { value: "new-pass-123" } });
    fireEvent.click(screen.getByRole("button", { name: "Set new password" }));
    expect((await screen.findByRole("alert")).textContent).toBe(message);
    expect(screen.queryByRole("button", { name: "Set new password" })).toBeNull(); // the link is spent
    fireEvent.click(screen.getByRole("link", { name: "Ask for a new link" }));
    expect(await screen.findByRole("heading", { name: "Reset your password" })).toBeTruthy();
  });
});

describe("email change", () => {
  const anonymous = () => ({ status: 403, body: { error: { code: "not_authenticated", message: "no", detail: null } } });
  const TOKEN = "eyJ1c2VyIjoxLCJvbGQiOiJhZGFAZXhhbXBsZS5jb20ifQ:1uAbCd:Zx_9-Qr";
  const NEW = "ada@engines.example";
  const confirmUrl = "/api/v1/auth/email/confirm";
  const refusal = (status: number, code: string, message: string, detail: unknown = null) => ({
    status,
    body: { error: { code, message, detail } },
  });

  it("shows the current address and sends a confirmation link to the new one", async () => {
    let answer: { status: number; body: unknown } = refusal(400, "invalid", "request failed", { current_password: ["wrong password"] });
    const { calls } = mockApi({ "GET /api/v1/auth/me": ME, "POST /api/v1/auth/email": () => answer });
    renderAt(<App />, "/account");
    const form = within(await screen.findByRole("form", { name: "Email address" }));
    expect(form.getByTestId("current-email").textContent).toBe("ada@example.com");
    // Above the password card.
    const titles = screen.getAllByRole("heading", { level: 2 }).map((h) => h.textContent);
    expect(titles.indexOf("Email address")).toBeLessThan(titles.indexOf("Change password"));
    const email = form.getByLabelText("New email") as HTMLInputElement;
    const password = form.getByLabelText("Current password") as HTMLInputElement;

    fireEvent.change(email, { target: { value: NEW } });
    fireEvent.change(password, { target: { value: "not-my-password" } });
    fireEvent.click(form.getByRole("button", { name: "Send confirmation link" }));
    expect((await form.findByRole("alert")).textContent).toContain("Current password: wrong password");
    expect(form.queryByRole("status")).toBeNull();
    expect(email.value).toBe(NEW); // kept for another try

    answer = { status: 202, body: { detail: `a link to confirm ${NEW} is on its way to that address` } };
    fireEvent.change(password, { target: { value: "pw-12345678" } });
    fireEvent.click(form.getByRole("button", { name: "Send confirmation link" }));
    const sent = await form.findByRole("status");
    expect(sent.textContent).toBe(`We sent a link to ${NEW}. Your address changes when you open it (valid 24 hours).`);
    expect(form.queryByRole("alert")).toBeNull();
    expect(email.value).toBe("");
    expect(password.value).toBe("");
    // Nothing changes before the link is opened.
    expect(form.getByTestId("current-email").textContent).toBe("ada@example.com");
    expect(calls.filter((c) => c.path === "/api/v1/auth/email").map((c) => c.body)).toEqual([
      { new_email: NEW, current_password: "not-my-password" },
      { new_email: NEW, current_password: "pw-12345678" },
    ]);
  });

  it("shows why the server refuses the new address", async () => {
    mockApi({
      "GET /api/v1/auth/me": ME,
      "POST /api/v1/auth/email": () => refusal(409, "exists", "another account uses that email address"),
    });
    renderAt(<App />, "/account");
    const form = within(await screen.findByRole("form", { name: "Email address" }));
    fireEvent.change(form.getByLabelText("New email"), { target: { value: "grace@example.com" } });
    fireEvent.change(form.getByLabelText("Current password"), { target: { value: "pw-12345678" } });
    fireEvent.click(form.getByRole("button", { name: "Send confirmation link" }));
    expect((await form.findByRole("alert")).textContent).toBe("another account uses that email address");
    expect(form.queryByRole("status")).toBeNull();
  });

  it("confirms the link once under StrictMode, even signed in, and the console shows the new address", async () => {
    let me = ME;
    const { calls } = mockApi({
      "GET /api/v1/auth/me": () => ({ body: me }),
      [`POST ${confirmUrl}`]: () => {
        if (me.user.email === NEW) return refusal(400, "invalid", "request failed", { token: ["this link was already used"] });
        me = { ...ME, user: { ...ME.user, email: NEW } };
        return { body: { email: NEW } };
      },
      "GET /api/v1/programs": page([]),
    });
    renderAt(<App />, `/confirm-email/${TOKEN}`, { strict: true });
    expect(await screen.findByRole("heading", { name: "Confirm your new email address" })).toBeTruthy();
    expect((await screen.findByText(/now signs in with/)).textContent).toBe(`Your account now signs in with ${NEW}.`);
    expect(screen.queryByRole("alert")).toBeNull();
    const posts = calls.filter((c) => c.path === confirmUrl);
    expect(posts.map((c) => c.body)).toEqual([{ token: TOKEN }]);
    // /auth/me was read again after the change, so the header shows the new address.
    const confirmedAt = calls.findIndex((c) => c.path === confirmUrl);
    expect(calls.slice(confirmedAt).some((c) => c.path === "/api/v1/auth/me")).toBe(true);
    fireEvent.click(screen.getByRole("link", { name: "Go to Programs" }));
    expect(await screen.findByRole("heading", { name: "Programs" })).toBeTruthy();
    expect(document.querySelector(".user-email")?.textContent).toBe(NEW);
    expect(calls.filter((c) => c.path === confirmUrl)).toHaveLength(1);
  });

  it("offers to log in when the link is opened signed out", async () => {
    const { calls } = mockApi({ "GET /api/v1/auth/me": anonymous, [`POST ${confirmUrl}`]: { email: NEW } });
    renderAt(<App />, `/confirm-email/${TOKEN}`);
    expect((await screen.findByText(/now signs in with/)).textContent).toBe(`Your account now signs in with ${NEW}.`);
    expect(screen.queryByRole("link", { name: "Go to Programs" })).toBeNull();
    fireEvent.click(screen.getByRole("link", { name: "Log in" }));
    expect(await screen.findByRole("heading", { name: "Log in" })).toBeTruthy();
    expect(calls.filter((c) => c.path === confirmUrl).map((c) => c.body)).toEqual([{ token: TOKEN }]);
  });

  it("explains a used or expired link and sends the user to their account to ask again", async () => {
    const message = "this link is invalid or has expired: ask for a new one";
    const { calls } = mockApi({
      "GET /api/v1/auth/me": ME,
      [`POST ${confirmUrl}`]: () => refusal(400, "invalid", "request failed", { token: [message] }),
      "POST /api/v1/auth/email": () => ({ status: 202, body: { detail: "on its way" } }),
    });
    renderAt(<App />, `/confirm-email/${TOKEN}`, { strict: true });
    expect((await screen.findByRole("alert")).textContent).toBe(message);
    expect(screen.queryByText(/now signs in with/)).toBeNull();
    expect(screen.queryByRole("button", { name: "Retry" })).toBeNull(); // the link is spent
    fireEvent.click(screen.getByRole("link", { name: /Ask for a new link/ }));
    expect(await screen.findByRole("form", { name: "Email address" })).toBeTruthy();
    expect(calls.filter((c) => c.path === confirmUrl)).toHaveLength(1);
  });

  it("says when another account took the address meanwhile, and retries only what may pass", async () => {
    let answer = refusal(429, "throttled", "Request was throttled. Expected available in 3 seconds.");
    const { calls } = mockApi({ "GET /api/v1/auth/me": anonymous, [`POST ${confirmUrl}`]: () => answer });
    renderAt(<App />, `/confirm-email/${TOKEN}`);
    expect((await screen.findByRole("alert")).textContent).toContain("throttled");
    answer = refusal(409, "exists", "another account uses that email address");
    fireEvent.click(screen.getByRole("button", { name: "Retry" }));
    await waitFor(() => expect(screen.getByRole("alert").textContent).toBe("another account uses that email address"));
    expect(screen.queryByRole("button", { name: "Retry" })).toBeNull();
    expect(screen.getByRole("link", { name: /Ask for a new link/ })).toBeTruthy();
    expect(calls.filter((c) => c.path === confirmUrl)).toHaveLength(2);
  });
});

describe("reset link validity", () => {
  it("says the server's lifetime in words", () => {
    expect(validity(60)).toBe("an hour");
    expect(validity(30)).toBe("30 minutes");
    expect(validity(1)).toBe("a minute");
    expect(validity(1440)).toBe("24 hours");
  });
});

describe("tool hosts", () => {
  it("lets an owner replace the tenant's tool hosts and shows the server's refusal", async () => {
    let hosts = ["api.example.com"];
    const { calls } = mockApi({
      "GET /api/v1/auth/me": ME,
      "GET /api/v1/members": page([]),
      "GET /api/v1/invitations": page([]),
      "GET /api/v1/audit-log": page([]),
      "GET /api/v1/tool-hosts": () => ({ body: { hosts, max_hosts: 8 } }),
      "PUT /api/v1/tool-hosts": (req: { body: unknown }) => {
        const asked = (req.body as { hosts: string[] }).hosts;
        if (asked.includes("127.0.0.1")) {
          return { status: 400, body: { error: { code: "invalid", message: "'127.0.0.1' is an internal address: only an operator may allow those", detail: null } } };
        }
        hosts = asked.map((h) => h.toLowerCase());
        return { body: { hosts, max_hosts: 8 } };
      },
    });
    renderAt(<App />, "/team");
    const input = (await screen.findByLabelText(/Hosts \(one per line/)) as HTMLTextAreaElement;
    expect(input.value).toBe("api.example.com");
    expect(screen.getByTestId("tool-hosts-count").textContent).toBe("1 of 8 allowed by the plan");
    fireEvent.change(input, { target: { value: "api.example.com\nTools.Example.org:8443" } });
    fireEvent.click(screen.getByRole("button", { name: "Save tool hosts" }));
    await waitFor(() => expect(screen.getByTestId("tool-hosts-count").textContent).toBe("2 of 8 allowed by the plan"));
    expect(calls.find((c) => c.method === "PUT" && c.path === "/api/v1/tool-hosts")?.body).toEqual({ hosts: ["api.example.com", "Tools.Example.org:8443"] });
    expect(input.value).toBe("api.example.com\ntools.example.org:8443");
    fireEvent.change(input, { target: { value: "127.0.0.1" } });
    fireEvent.click(screen.getByRole("button", { name: "Save tool hosts" }));
    expect(await screen.findByText(/internal address/)).toBeTruthy();
  });
});
