// One function per API operation the console uses; pages call these, tests mock fetch beneath.
import { http, rawFetch, unwrap } from "./client";
import { ApiError } from "./errors";
import type {
  AdminTenant,
  AuditEntry,
  ApiKey,
  EngineTimeline,
  Invitation,
  InvitationPreview,
  Invoice,
  KeyScope,
  KVFile,
  Me,
  Member,
  NewApiKey,
  NewInvitation,
  Program,
  ProgramVersion,
  Quota,
  Role,
  Run,
  RunLogs,
  RunTrace,
  ServiceHealth,
  UsageDay,
  UsageGroup,
  UsageGrouping,
  WorkerHealth,
} from "./types";

const PAGE = { limit: 200 };
// Multipart bodies go through as FormData (the browser sets the boundary).
const formData = (body: unknown) => body as FormData;

// ---- auth ------------------------------------------------------------------------------
export async function ensureCsrf(): Promise<void> {
  await unwrap(http.GET("/api/v1/auth/csrf"));
}
export async function getMe(): Promise<Me | null> {
  const { data, response } = await http.GET("/api/v1/auth/me");
  if (response.status === 401 || response.status === 403) return null;
  if (!response.ok) throw new ApiError(response.status, "error", `HTTP ${response.status}`);
  return data as unknown as Me;
}
export async function login(email: string, password: string): Promise<Me> {
  await ensureCsrf();
  return (await unwrap(http.POST("/api/v1/auth/login", { body: { email, password } }))) as unknown as Me;
}
export async function signup(email: string, password: string, tenant_name: string): Promise<Me> {
  await ensureCsrf();
  return (await unwrap(
    http.POST("/api/v1/auth/signup", { body: { email, password, tenant_name } }),
  )) as unknown as Me;
}
/** Sign up through an invitation: the new user joins its tenant instead of creating one. */
export async function signupWithInvite(email: string, password: string, invite: string): Promise<Me> {
  await ensureCsrf();
  return (await unwrap(
    http.POST("/api/v1/auth/signup", { body: { email, password, invite } }),
  )) as unknown as Me;
}
export async function logout(): Promise<void> {
  await unwrap(http.POST("/api/v1/auth/logout"));
}
export async function switchTenant(tenant: number): Promise<Me> {
  return (await unwrap(http.POST("/api/v1/auth/switch-tenant", { body: { tenant } }))) as unknown as Me;
}

export async function changePassword(current_password: string, new_password: string): Promise<void> {
  await unwrap(http.POST("/api/v1/auth/password", { body: { current_password, new_password } }));
}
/** Ask for a password-reset link by mail. The server answers 202 whether or not an account
 * uses the address (no account enumeration), so success says only that the request was taken. */
export async function requestPasswordReset(email: string): Promise<number | null> {
  const answer = (await unwrap(http.POST("/api/v1/auth/password-reset", { body: { email } }))) as { valid_minutes?: unknown } | undefined;
  return typeof answer?.valid_minutes === "number" ? answer.valid_minutes : null;
}
/** Set a new password through a mailed link `/reset-password/<uid>/<token>` (works once).
 * `revoke_api_keys`: also revoke every API key the account minted before now (the default). */
export async function confirmPasswordReset(uid: string, token: string, new_password: string, revoke_api_keys = true): Promise<void> {
  await unwrap(http.POST("/api/v1/auth/password-reset/confirm", { body: { uid, token, new_password, revoke_api_keys } }));
}
/** Open the sign-up's mailed link `/verify-email/<token>` (works once, no session needed);
 * answers the verified address. */
export async function verifyEmail(token: string): Promise<string> {
  const body = (await unwrap(http.POST("/api/v1/auth/verify-email", { body: { token } }))) as { email?: unknown };
  return String(body.email ?? "");
}
/** Mail the signed-in user's verification link again (at most one a minute): the server's
 * sentence to show. */
export async function resendVerification(): Promise<string> {
  const body = (await unwrap(http.POST("/api/v1/auth/verify-email/resend", {}))) as { detail?: unknown };
  return String(body.detail ?? "");
}
/** Ask to sign in with another address (console session only): the server mails a link to
 * `new_email`, and the address changes only when it is opened (see confirmEmailChange). 202. */
export async function requestEmailChange(new_email: string, current_password: string): Promise<void> {
  await unwrap(http.POST("/api/v1/auth/email", { body: { new_email, current_password } }));
}
/** Open a mailed link `/confirm-email/<token>` (works once, no session needed); answers the
 * address the account now signs in with. */
export async function confirmEmailChange(token: string): Promise<string> {
  const body = (await unwrap(http.POST("/api/v1/auth/email/confirm", { body: { token } }))) as { email?: unknown };
  return String(body.email ?? "");
}
/** A new tenant owned by the signed-in user, who is switched to it (the /auth/me body). */
export async function createTenant(name: string): Promise<Me> {
  return (await unwrap(http.POST("/api/v1/tenants", { body: { name } }))) as unknown as Me;
}
/** Close a tenant (owners; `confirm` is its slug): it stops at once and its programs, runs and KV
 * files are deleted. Answers with the /auth/me body, which no longer lists it. */
export async function closeTenant(tenant: number, confirm: string): Promise<Me> {
  return (await unwrap(
    http.POST("/api/v1/tenants/{tenant_id}/close", { params: { path: { tenant_id: tenant } }, body: { confirm } }),
  )) as unknown as Me;
}
/** What an invite link offers; readable without signing in (the token is the credential). */
export async function getInvitation(token: string): Promise<InvitationPreview> {
  return unwrap(http.GET("/api/v1/auth/invitations/{token}", { params: { path: { token } } }));
}
/** Join the invitation's tenant as the signed-in user; it becomes the active tenant. */
export async function acceptInvitation(token: string): Promise<Me> {
  return (await unwrap(
    http.POST("/api/v1/auth/invitations/{token}/accept", { params: { path: { token } } }),
  )) as unknown as Me;
}

// ---- team (active tenant) --------------------------------------------------------------
export async function listMembers(): Promise<Member[]> {
  const page = await unwrap(http.GET("/api/v1/members", { params: { query: PAGE } }));
  return page.results as Member[];
}
export async function setMemberRole(id: number, role: Role): Promise<Member> {
  return (await unwrap(
    http.PATCH("/api/v1/members/{id}", { params: { path: { id } }, body: { role } }),
  )) as Member;
}
/** Remove a member (owners), or leave the tenant when `id` is the caller's own membership. */
export async function removeMember(id: number): Promise<void> {
  await unwrap(http.DELETE("/api/v1/members/{id}", { params: { path: { id } } }));
}
/** The tenant's tool-host allowlist (`http_fetch`) and its plan's bound on it. */
export type ToolHosts = { hosts: string[]; max_hosts: number };
export async function getToolHosts(): Promise<ToolHosts> {
  return (await unwrap(http.GET("/api/v1/tool-hosts"))) as unknown as ToolHosts;
}
/** Replace the whole list (owners); the server normalizes it and says why an entry is refused. */
export async function setToolHosts(hosts: string[]): Promise<ToolHosts> {
  return (await unwrap(http.PUT("/api/v1/tool-hosts", { body: { hosts } }))) as unknown as ToolHosts;
}
export async function listAuditLog(): Promise<AuditEntry[]> {
  const page = await unwrap(http.GET("/api/v1/audit-log", { params: { query: PAGE } }));
  return page.results;
}
export async function listInvitations(): Promise<Invitation[]> {
  const page = await unwrap(http.GET("/api/v1/invitations", { params: { query: PAGE } }));
  return page.results;
}
export async function createInvitation(email: string, role: Role): Promise<NewInvitation> {
  // The schema reuses the read model (with its read-only fields) as the request body.
  return unwrap(http.POST("/api/v1/invitations", { body: { email, role } as never }));
}
export async function revokeInvitation(id: number): Promise<void> {
  await unwrap(http.DELETE("/api/v1/invitations/{id}", { params: { path: { id } } }));
}
/** The link an owner passes on; the console serves /invite/<token> (see InvitePage). */
export function invitationLink(token: string): string {
  return `${window.location.origin}/invite/${encodeURIComponent(token)}`;
}

// ---- programs --------------------------------------------------------------------------
export async function listPrograms(): Promise<Program[]> {
  const page = await unwrap(http.GET("/api/v1/programs", { params: { query: PAGE } }));
  return page.results;
}
export async function getProgram(id: number): Promise<Program> {
  return unwrap(http.GET("/api/v1/programs/{id}", { params: { path: { id } } }));
}
export async function uploadProgram(file: File, name: string, description: string): Promise<Program> {
  const body = new FormData();
  body.append("file", file);
  body.append("name", name);
  body.append("description", description);
  return unwrap(http.POST("/api/v1/programs", { body: body as never, bodySerializer: formData }));
}
export async function deleteProgram(id: number): Promise<void> {
  await unwrap(http.DELETE("/api/v1/programs/{id}", { params: { path: { id } } }));
}
export async function listVersions(id: number): Promise<ProgramVersion[]> {
  return (await unwrap(
    http.GET("/api/v1/programs/{id}/versions", { params: { path: { id } } }),
  )) as unknown as ProgramVersion[];
}
export async function uploadVersion(id: number, file: File): Promise<ProgramVersion> {
  const body = new FormData();
  body.append("file", file);
  return (await unwrap(
    http.POST("/api/v1/programs/{id}/versions", {
      params: { path: { id } },
      body: body as never,
      bodySerializer: formData,
    }),
  )) as unknown as ProgramVersion;
}
export function sourceUrl(id: number, version: number): string {
  return `/api/v1/programs/${id}/versions/${version}/source`;
}
export async function getSource(id: number, version: number): Promise<string> {
  return (await rawFetch(sourceUrl(id, version))).text();
}

// ---- runs ------------------------------------------------------------------------------
export async function createRun(
  program: number,
  version: number | null,
  args: Record<string, unknown>,
  limits: Record<string, unknown>,
  name = "",
): Promise<Run> {
  // Without a name the server names the run after its program and first argument.
  const body = name ? { program, version, args, limits, name } : { program, version, args, limits };
  return (await unwrap(http.POST("/api/v1/runs", { body: body as never }))) as unknown as Run;
}
export async function listRuns(program?: number, status?: string, parent?: string): Promise<Run[]> {
  const query = {
    ...PAGE,
    ...(program === undefined ? {} : { program }),
    ...(status ? { status } : {}),
    ...(parent ? { parent } : {}),
  };
  const page = await unwrap(http.GET("/api/v1/runs", { params: { query: query as typeof PAGE } }));
  return page.results;
}
export async function getRun(id: string): Promise<Run> {
  return unwrap(http.GET("/api/v1/runs/{id}", { params: { path: { id } } }));
}
export async function cancelRun(id: string): Promise<Run> {
  return unwrap(http.POST("/api/v1/runs/{id}/cancel", { params: { path: { id } } }));
}
export async function getRunLogs(id: string): Promise<RunLogs> {
  return unwrap(http.GET("/api/v1/runs/{id}/logs", { params: { path: { id } } }));
}
/** The run's span tree (docs/ARCHITECTURE.md, "Traces"); `complete` is false until it ended. */
export async function getRunTrace(id: string): Promise<RunTrace> {
  return unwrap(http.GET("/api/v1/runs/{run_id}/trace", { params: { path: { run_id: id } } }));
}
/** The same trace as Chrome trace events, the file Perfetto and chrome://tracing open. */
export function runTraceChromeUrl(id: string): string {
  return `/api/v1/runs/${id}/trace?format=chrome`;
}
export function runEventsUrl(id: string): string {
  return `/api/v1/runs/${id}/events`;
}

// ---- KV files --------------------------------------------------------------------------
export interface KVListing {
  files: KVFile[];
  /** True when the worker was unreachable and the last mirror was served. */
  stale: boolean;
  /** Every file of the tenant; `files` is the page from `offset` (a plan allows up to 10,000). */
  count: number;
  offset: number;
}
export const KV_PAGE_SIZE = 100;
export async function listKVFiles(offset = 0): Promise<KVListing> {
  const query = { limit: KV_PAGE_SIZE, offset };
  const { data, error, response } = await http.GET("/api/v1/kv-files", { params: { query } });
  if (!response.ok || !data) throw new ApiError(response.status, "error", errorText(error, response));
  return { files: data.results, stale: response.headers.get("X-Symphony-Stale") === "1", count: data.count, offset };
}
export async function pinKVFile(id: number, pinned: boolean): Promise<KVFile> {
  return unwrap(http.POST("/api/v1/kv-files/{id}/pin", { params: { path: { id } }, body: { pinned } }));
}
export async function deleteKVFile(id: number): Promise<void> {
  await unwrap(http.DELETE("/api/v1/kv-files/{id}", { params: { path: { id } } }));
}

// ---- usage & billing -------------------------------------------------------------------
export async function getUsage(from: string, to: string): Promise<UsageDay[]> {
  const body = (await unwrap(http.GET("/api/v1/usage", { params: { query: { from, to } } }))) as unknown as { days: UsageDay[] };
  return body.days;
}
/** The range's usage summed per program or per API key (plus console runs and KV storage). */
export async function getUsageGroups(from: string, to: string, groupBy: UsageGrouping): Promise<UsageGroup[]> {
  const body = (await unwrap(http.GET("/api/v1/usage", { params: { query: { from, to, group_by: groupBy } } }))) as unknown as {
    groups: UsageGroup[];
  };
  return body.groups;
}
export async function getQuota(): Promise<Quota> {
  return (await unwrap(http.GET("/api/v1/quota"))) as unknown as Quota;
}
export async function listInvoices(): Promise<Invoice[]> {
  return (await unwrap(http.GET("/api/v1/invoices"))) as unknown as Invoice[];
}

// ---- API keys --------------------------------------------------------------------------
export async function listApiKeys(): Promise<ApiKey[]> {
  const page = await unwrap(http.GET("/api/v1/api-keys", { params: { query: PAGE } }));
  return page.results;
}
export async function createApiKey(name: string, scopes: KeyScope[]): Promise<NewApiKey> {
  return (await unwrap(http.POST("/api/v1/api-keys", { body: { name, scopes } as never }))) as unknown as NewApiKey;
}
export async function revokeApiKey(id: number): Promise<void> {
  await unwrap(http.DELETE("/api/v1/api-keys/{id}", { params: { path: { id } } }));
}

// ---- staff -----------------------------------------------------------------------------
export async function listAllKVFiles(): Promise<KVFile[]> {
  const page = await unwrap(http.GET("/api/v1/admin/kv-files", { params: { query: PAGE } }));
  return page.results;
}
export async function evictKVFile(id: number): Promise<void> {
  await unwrap(http.POST("/api/v1/admin/kv-files/{id}/evict", { params: { path: { id } } }));
}
export async function listTenants(): Promise<AdminTenant[]> {
  return (await unwrap(http.GET("/api/v1/admin/tenants"))) as unknown as AdminTenant[];
}
export async function listPlans(): Promise<string[]> {
  return ((await (await rawFetch("/api/v1/admin/plans")).json()) as { plans: string[] }).plans;
}
export async function setTenantPlan(id: number, plan: string): Promise<void> {
  await rawFetch(`/api/v1/admin/tenants/${id}`, {
    method: "PATCH",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ plan }),
  });
}
/** Staff close a tenant they do not own; `confirm` is its slug, as for an owner. */
export async function staffCloseTenant(id: number, confirm: string): Promise<void> {
  await rawFetch(`/api/v1/admin/tenants/${id}/close`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ confirm }),
  });
}
export async function getServiceHealth(): Promise<ServiceHealth> {
  const response = await globalThis.fetch(new URL("/api/v1/health", window.location.origin));
  return (await response.json()) as ServiceHealth;
}
/** Worker health (`GET /api/v1/admin/workers`); null while the control plane does not serve it. */
/** `GET /api/v1/staff/workers/<name>/timeline`: the worker's last forwards, staff only
 * (``format=chrome``: the same as Chrome trace events, for Perfetto). */
export function engineTimelineUrl(name: string, format: "json" | "chrome"): string {
  return `/api/v1/staff/workers/${encodeURIComponent(name)}/timeline?format=${format}`;
}
export async function getEngineTimeline(name: string): Promise<EngineTimeline> {
  return (await (await rawFetch(engineTimelineUrl(name, "json"))).json()) as EngineTimeline;
}
export async function listWorkers(): Promise<WorkerHealth[] | null> {
  try {
    const body = (await (await rawFetch("/api/v1/admin/workers")).json()) as unknown;
    if (Array.isArray(body)) return body as WorkerHealth[];
    const wrapped = body as { results?: WorkerHealth[]; workers?: WorkerHealth[] };
    return wrapped.results ?? wrapped.workers ?? [];
  } catch (err) {
    if (err instanceof ApiError && err.status === 404) return null;
    throw err;
  }
}

function errorText(error: unknown, response: Response): string {
  const env = (error as { error?: { message?: string } } | undefined)?.error;
  return env?.message ?? `HTTP ${response.status}`;
}
