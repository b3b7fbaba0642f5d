// The typed HTTP client: openapi-fetch over the generated `paths`, with the session's CSRF
// token on unsafe methods and errors unwrapped into ApiError.
import createClient, { type Middleware } from "openapi-fetch";
import type { paths } from "./schema";
import { reportSessionExpired } from "../auth/sessionExpiry";
import { isSessionExpired, toApiError, type ApiError } from "./errors";

export function readCookie(name: string): string | null {
  for (const part of document.cookie.split(";")) {
    const [k, ...v] = part.trim().split("=");
    if (k === name) return decodeURIComponent(v.join("="));
  }
  return null;
}

const SAFE = new Set(["GET", "HEAD", "OPTIONS"]);

const csrf: Middleware = {
  onRequest({ request }) {
    if (!SAFE.has(request.method)) {
      const token = readCookie("csrftoken");
      if (token) request.headers.set("X-CSRFToken", token);
    }
    return request;
  },
};

export const http = createClient<paths>({
  baseUrl: typeof window !== "undefined" ? window.location.origin : "",
  credentials: "same-origin",
  // Resolve fetch at call time so tests can stub globalThis.fetch.
  fetch: (req: Request) => globalThis.fetch(req),
});
http.use(csrf);

interface FetchResult<T> {
  data?: T;
  error?: unknown;
  response: Response;
}

/** An error the whole console acts on (the session ran out) is reported before it is thrown. */
function reported(err: ApiError): ApiError {
  if (isSessionExpired(err)) reportSessionExpired();
  return err;
}

/** Return the body of a successful response or throw an ApiError. */
export async function unwrap<T>(pending: Promise<FetchResult<T>>): Promise<T> {
  const { data, error, response } = await pending;
  if (!response.ok) throw reported(toApiError(response.status, error));
  return data as T;
}

/** Raw fetch for endpoints outside the schema (text bodies, optional routes). */
export async function rawFetch(path: string, init: RequestInit = {}): Promise<Response> {
  const headers = new Headers(init.headers);
  if (init.method && !SAFE.has(init.method)) {
    const token = readCookie("csrftoken");
    if (token) headers.set("X-CSRFToken", token);
  }
  const response = await globalThis.fetch(new URL(path, window.location.origin), {
    credentials: "same-origin",
    ...init,
    headers,
  });
  if (!response.ok) {
    const text = await response.text();
    let body: unknown = text;
    try {
      body = JSON.parse(text);
    } catch {
      /* not JSON */
    }
    throw reported(toApiError(response.status, body));
  }
  return response;
}
