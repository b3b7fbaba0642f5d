// Response shapes. Models come from the generated OpenAPI types (src/api/schema.d.ts, made by
// `npm run gen:api` from openapi/schema.yml). The few endpoints the schema describes only as a
// free-form object (auth/me, usage, quota, invoices, admin tenants) are typed here after
// docs/API.md.
import type { components } from "./schema";

type Schemas = components["schemas"];
export type ApiKey = Schemas["ApiKey"];
export type NewApiKey = ApiKey & { secret: string };
export type KeyScope = Schemas["ScopesEnum"];
/** Every scope an API key can carry (same order as the server's KEY_SCOPES). */
export const KEY_SCOPES: readonly KeyScope[] = ["programs", "runs", "kv", "usage"];
export type Program = Schemas["Program"];
export type Run = Schemas["Run"];
export type RunLogs = Schemas["RunLogs"];
export type RunTrace = Schemas["RunTrace"];
export type RunTraceSpan = Schemas["RunTraceSpan"];
/** `GET /staff/workers/<name>/timeline`: a worker's last forwards (staff only). */
export type EngineTimeline = Schemas["EngineTimeline"];
export type EngineForward = Schemas["EngineForward"];
export type KVFile = Schemas["KVFile"];

export type Role = Schemas["RoleEnum"];
/** The roles of a tenant, least privileged first (the order of the role selects). */
export const ROLES: readonly Role[] = ["member", "owner"];
/** A membership of the active tenant. The schema marks `role` optional only because it is the
 * writable field of a PATCH; every response carries it. */
export type Member = Schemas["Member"] & { role: Role };
/** A pending invitation (`GET /invitations`); its token is never listed. */
export type Invitation = Schemas["Invitation"];
/** `POST /invitations`: the invitation with its one-time token (the link is /invite/<token>) and
 * `emailed`, whether the link was also queued to be mailed to the invitee. */
export type NewInvitation = Schemas["NewInvitation"];
/** `GET /auth/invitations/<token>`: what an invite link offers, readable before signing in. */
export type InvitationPreview = Schemas["InvitationPreview"];
/** One row of `GET /audit-log` (owners): a team change or an operator action on the tenant. */
export type AuditEntry = Schemas["AuditLog"];

/** `GET /programs/<id>/versions` (the schema leaves this action's response untyped). */
export interface ProgramVersion {
  number: number;
  kind: "py" | "zip" | string;
  sha256: string;
  size: number;
  created_at: string;
}

export type RunStatus = "queued" | "running" | "succeeded" | "failed" | "timed_out" | "cancelled";
export const TERMINAL_STATUSES: readonly string[] = ["succeeded", "failed", "timed_out", "cancelled"];

export interface TenantRef {
  id: number;
  name: string;
  slug: string;
  role: string;
}

export interface Me {
  /** `email_verified`: false until a sign-up opens the link mailed to its address. */
  user: { id: number; email: string; is_staff: boolean; email_verified?: boolean } | null;
  tenants: TenantRef[];
  /** null once the user belongs to no tenant (e.g. removed from their only one). */
  active_tenant: number | null;
}

export interface UsageDay {
  day: string;
  runs: number;
  prefill_tokens: number;
  decode_tokens: number;
  pred_calls: number;
  page_seconds: number;
  io_calls: number;
  /** USD to the micro-dollar: the day's quantities at the tenant's prices (as its invoice has them). */
  cost?: string;
}

export type UsageGrouping = "program" | "api_key";

/** One row of `GET /usage?group_by=`: a program, an API key, console runs (no key) or KV storage. */
export interface UsageGroup {
  kind: "program" | "api_key" | "console" | "deleted" | "storage";
  id: number | null;
  name: string | null;
  prefix?: string | null;
  runs: number;
  prefill_tokens: number;
  /** Prompt tokens served from the prefix cache or stored KV files (billed at the plan's ratio). */
  cached_tokens?: number;
  decode_tokens: number;
  sandbox_seconds: number;
  kv_gib_hours: number;
  /** USD to the micro-dollar, at the tenant's prices. */
  cost?: string;
}

/** `GET /quota`. Fields beyond the first version of the API are optional (null = unlimited). */
export interface Quota {
  plan: string;
  /** The largest program file an upload may be (bytes); the console checks it before sending. */
  max_program_bytes?: number;
  limits: {
    max_concurrent_runs: number;
    max_tokens_per_run: number;
    max_run_seconds?: number;
    /** Older name of max_run_seconds. */
    max_deadline_s?: number;
    tokens_per_month?: number | null;
    max_device_pages_per_run?: number | null;
    kv_bytes_stored?: number | null;
    /** Shared by all of the tenant's keys and members; null = unlimited. */
    api_requests_per_minute?: number | null;
    /** Fractions of each worker's device pool (pinned KV files) and host tier (spilled ones). */
    kv_pinned_device_share?: number | null;
    kv_host_share?: number | null;
    max_kv_files?: number | null;
  };
  use: { active_runs: number; tokens_this_month?: number; kv_bytes_stored?: number; account_kv_bytes_stored?: number; kv_files?: number; account_kv_files?: number };
  allowed_tool_hosts?: string[];
}

export interface InvoiceLine {
  item: string;
  description: string;
  quantity: string | number;
  unit_price: string;
  amount: string;
}

export interface Invoice {
  id: string;
  period_start: string;
  period_end: string;
  runs: number;
  currency: string;
  lines: InvoiceLine[];
  /** One line per UTC day with usage; the amounts sum to `total`. */
  days?: InvoiceDay[];
  total: string;
}

export interface InvoiceDay {
  day: string;
  runs: number;
  amount: string;
}

export interface AdminTenant {
  id: number;
  slug: string;
  name: string;
  plan: string;
  members: number;
  programs: number;
  active_runs: number;
  /** When an owner closed it (its data is deleted: `purged_at`), or null while open. */
  closed_at?: string | null;
  purged_at?: string | null;
}

/** Worker health as the worker's admin `health` op reports it (served at /admin/workers). */
export interface WorkerHealth {
  name: string;
  ok: boolean;
  device?: string;
  model?: string;
  pages_total?: number;
  pages_free?: number;
  sessions?: number;
  error?: string;
  metrics?: {
    batch_occupancy?: number;
    queued_calls?: number;
    queued_tokens?: number;
    forwards?: number;
    forward_ms_avg?: number;
  };
}

export interface ServiceHealth {
  status: string;
  checks: Record<string, string>;
}
