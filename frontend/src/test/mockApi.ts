import { vi } from "vitest";

export type Handler = (req: { method: string; path: string; search: URLSearchParams; body: unknown }) => {
  status?: number;
  body?: unknown;
  headers?: Record<string, string>;
};

/** Stub globalThis.fetch with a table of "METHOD /path" handlers; records every call. */
export function mockApi(routes: Record<string, Handler | unknown>) {
  const calls: { method: string; path: string; body: unknown }[] = [];
  const fetchMock = vi.fn(async (input: RequestInfo | URL, init?: RequestInit) => {
    const req = input instanceof Request ? input : new Request(String(input), init);
    const url = new URL(req.url);
    const method = req.method.toUpperCase();
    let body: unknown = undefined;
    const type = req.headers.get("content-type") ?? "";
    if (method !== "GET" && method !== "HEAD") {
      if (type.includes("application/json")) body = await req.json();
      // jsdom's File streams never finish inside undici's Request.formData(): record the marker
      // only; tests inspect the FormData through a spy on FormData.prototype.append.
      else if (type.includes("multipart/form-data")) body = "multipart";
    }
    calls.push({ method, path: url.pathname, body });
    const key = `${method} ${url.pathname}`;
    const route = routes[key];
    if (route === undefined) {
      return new Response(JSON.stringify({ error: { code: "not_found", message: `no mock for ${key}`, detail: null } }), {
        status: 404,
        headers: { "content-type": "application/json" },
      });
    }
    const res =
      typeof route === "function" ? (route as Handler)({ method, path: url.pathname, search: url.searchParams, body }) : { body: route };
    const status = res.status ?? 200;
    const payload = status === 204 ? null : typeof res.body === "string" ? res.body : JSON.stringify(res.body ?? {});
    return new Response(payload, {
      status,
      headers: { "content-type": typeof res.body === "string" ? "text/plain" : "application/json", ...res.headers },
    });
  });
  vi.stubGlobal("fetch", fetchMock);
  return { calls, fetchMock };
}

export const ME = {
  user: { id: 1, email: "ada@example.com", is_staff: false },
  tenants: [{ id: 7, name: "Acme", slug: "acme", role: "owner" }],
  active_tenant: 7,
};

export function page<T>(results: T[]) {
  return { count: results.length, next: null, previous: null, results };
}
