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

  /** Per-field validation messages as sentences ("Max tokens can be at most 4,096 …"),
   * nested fields (`limits.max_tokens`) included; DRF's `{"detail": message}` (the message
   * itself, not a field) is none. */
  fieldMessages(): string[] {
    if (!this.detail || typeof this.detail !== "object") return [];
    const out: string[] = [];
    const { detail: only, ...rest } = this.detail as Record<string, unknown>;
    if (only === this.message && Object.keys(rest).length === 0) return [];
    const walk = (node: unknown, field: string) => {
      if (Array.isArray(node)) out.push(sayField(field, node.map(String).join(" ")));
      else if (node && typeof node === "object") for (const [k, v] of Object.entries(node)) walk(v, k);
      else if (node !== undefined && node !== null) out.push(sayField(field, String(node)));
    };
    for (const [field, msgs] of Object.entries(this.detail as Record<string, unknown>)) walk(msgs, field);
    return out;
  }

  /** A 400 whose detail names fields (DRF validation), as opposed to one message. */
  get hasFieldErrors(): boolean {
    return this.status === 400 && this.fieldMessages().length > 0;
  }
}

/** What the console says when the session ran out (the server answers `not_authenticated`). */
export const SESSION_EXPIRED = "Your session expired — sign in again";

/** The request was refused because the session ended (expired, or signed out elsewhere). */
export function isSessionExpired(err: unknown): boolean {
  return err instanceof ApiError && err.code === "not_authenticated";
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
  if (isSessionExpired(err)) return SESSION_EXPIRED;
  if (err instanceof ApiError) {
    const fields = err.fieldMessages();
    // DRF's validation errors carry no message of their own ("request failed").
    if (fields.length) return err.message === "request failed" ? fields.join(" ") : `${err.message}: ${fields.join(" ")}`;
    return err.message;
  }
  if (err instanceof Error) return err.message;
  return String(err);
}

/** Plain names for the API's field names, as the console's forms label them. */
const FIELD_LABELS: Record<string, string> = {
  max_tokens: "Max tokens",
  deadline_s: "Deadline",
  max_pages: "Max KV pages",
  memory_mb: "Memory",
  args: "Arguments",
  name: "Name",
  file: "File",
  email: "Email",
  password: "Password",
  new_password: "New password",
  tenant_name: "Organisation name",
  plan: "Plan",
  confirm: "Confirmation",
  version: "Version",
  program: "Program",
};

export function fieldLabel(field: string): string {
  return FIELD_LABELS[field] ?? field.replaceAll("_", " ").replace(/^./, (c) => c.toUpperCase());
}

/** Messages that read on from the field's name: "Max tokens" + "can be at most 4,096 …". */
const PREDICATE = /^(can|cannot|must|is|are|should|may|has|needs|does)\b/;

/** One sentence for a field's message: a predicate reads on from the field's name, a sentence
 * ("This password is too common.") stands alone, anything else follows "Field: ". */
export function sayField(field: string, message: string): string {
  const text = message.trim();
  const sentence = PREDICATE.test(text) ? `${fieldLabel(field)} ${text}` : /^[a-z]/.test(text) ? `${fieldLabel(field)}: ${text}` : text;
  return /[.!?]$/.test(sentence) ? sentence : `${sentence}.`;
}

/** The message for the field at `path` of a 400 (e.g. "limits", "max_tokens"), or null. */
export function fieldError(err: unknown, ...path: string[]): string | null {
  if (!(err instanceof ApiError) || err.status !== 400) return null;
  let node: unknown = err.detail;
  for (const key of path) {
    if (!node || typeof node !== "object" || Array.isArray(node)) return null;
    node = (node as Record<string, unknown>)[key];
  }
  if (Array.isArray(node) && node.length) return sayField(path[path.length - 1], node.map(String).join(" "));
  return typeof node === "string" ? sayField(path[path.length - 1], node) : null;
}
