/** An API error in the service's envelope `{"error": {code, message, detail}}`. */
export class ApiError extends Error {
  readonly status: number;
  readonly code: string;
  readonly detail: unknown;

  constructor(status: number, code: string, message: string, detail: unknown = null) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.code = code;
    this.detail = detail;
  }

  /** Per-field validation messages flattened to "field: message" lines. */
  fieldMessages(): string[] {
    if (!this.detail || typeof this.detail !== "object") return [];
    return Object.entries(this.detail as Record<string, unknown>).map(
      ([field, msgs]) => `${field}: ${Array.isArray(msgs) ? msgs.join(" ") : String(msgs)}`,
    );
  }
}

export function toApiError(status: number, body: unknown): ApiError {
  const env = (body as { error?: { code?: string; message?: string; detail?: unknown } } | null)?.error;
  if (env && typeof env === "object") {
    return new ApiError(status, env.code ?? "error", env.message ?? `HTTP ${status}`, env.detail ?? null);
  }
  const text = typeof body === "string" && body ? body.slice(0, 200) : `HTTP ${status}`;
  return new ApiError(status, status >= 500 ? "server_error" : "error", text);
}

export function errorMessage(err: unknown): string {
  if (err instanceof ApiError) {
    const fields = err.fieldMessages();
    return fields.length ? `${err.message} (${fields.join("; ")})` : err.message;
  }
  if (err instanceof Error) return err.message;
  return String(err);
}
