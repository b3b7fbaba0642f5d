import { useState, type FormEvent } from "react";
import { useNavigate } from "react-router";
import {
  createInvitation,
  invitationLink,
  listAuditLog,
  listInvitations,
  listMembers,
  removeMember,
  revokeInvitation,
  setMemberRole,
} from "../api/endpoints";
import { ROLES, type AuditEntry, type Invitation, type Member, type NewInvitation, type Role } from "../api/types";
import { useAuth } from "../auth/AuthContext";
import { ConfirmButton } from "../components/ConfirmButton";
import { CopyButton } from "../components/CopyButton";
import { PageHeader } from "../components/PageHeader";
import { ToolHostsCard } from "../components/ToolHostsCard";
import { AsyncBlock, Empty, ErrorBanner, Notice } from "../components/Status";
import { useAsync } from "../hooks/useAsync";
import { useAction } from "../hooks/useAction";
import { formatDate } from "../lib/format";

/** The invitation link, shown once: only a digest of its token is stored (like an API key). The
 * server also mails it to the invitee when it could queue the mail (`emailed`); the link stays
 * shown either way, to pass on by hand. */
function NewInvitationLink({ invitation, onDismiss }: { invitation: NewInvitation; onDismiss: () => void }) {
  const link = invitationLink(invitation.token);
  return (
    <div className="card secret" role="region" aria-labelledby="invite-link-title">
      <h2 id="invite-link-title">Invitation for {invitation.email}</h2>
      {invitation.emailed ? (
        <p data-testid="invite-mail">We emailed this link to {invitation.email}.</p>
      ) : (
        <Notice tone="warn">
          <span data-testid="invite-mail">Mail could not be sent: pass the link on yourself.</span>
        </Notice>
      )}
      <p>
        It is shown only once, works only for that address, and expires {formatDate(invitation.expires_at)}. They join as{" "}
        <strong>{invitation.role}</strong>.
      </p>
      <div className="secret-row">
        <code data-testid="invite-link">{link}</code>
        <CopyButton text={link} label="Copy link" />
      </div>
      <button type="button" className="btn btn-small" onClick={onDismiss}>
        Done
      </button>
    </div>
  );
}

function RoleSelect({ value, label, onChange }: { value: Role; label: string; onChange: (role: Role) => void }) {
  return (
    <select aria-label={label} value={value} onChange={(e) => onChange(e.target.value as Role)}>
      {ROLES.map((r) => (
        <option key={r} value={r}>
          {r}
        </option>
      ))}
    </select>
  );
}

function InviteForm({ onInvited }: { onInvited: (invitation: NewInvitation) => void }) {
  const [email, setEmail] = useState("");
  const [role, setRole] = useState<Role>("member");
  const { busy, error, run } = useAction();
  const submit = async (e: FormEvent) => {
    e.preventDefault();
    await run(async () => {
      onInvited(await createInvitation(email, role));
      setEmail("");
      setRole("member");
    });
  };
  return (
    <form className="card form" onSubmit={submit} aria-labelledby="invite-title">
      <h2 id="invite-title">Invite someone</h2>
      <ErrorBanner error={error} />
      <div className="row">
        <label className="field grow">
          Email
          <input type="email" required maxLength={254} value={email} onChange={(e) => setEmail(e.target.value)} />
          <span className="hint">Inviting the same address again replaces its pending link.</span>
        </label>
        <label className="field">
          Role
          <select value={role} onChange={(e) => setRole(e.target.value as Role)}>
            {ROLES.map((r) => (
              <option key={r} value={r}>
                {r}
              </option>
            ))}
          </select>
        </label>
      </div>
      <button type="submit" className="btn btn-primary" disabled={busy}>
        {busy ? "Creating…" : "Create invitation link"}
      </button>
    </form>
  );
}

interface MemberTableProps {
  members: Member[];
  myUserId: number | undefined;
  isOwner: boolean;
  onRoleChange: (m: Member, role: Role) => Promise<void>;
  onRemove: (m: Member) => Promise<void>;
}

function MemberTable({ members, myUserId, isOwner, onRoleChange, onRemove }: MemberTableProps) {
  return (
    <div className="table-wrap">
      <table>
        <caption className="visually-hidden">Members</caption>
        <thead>
          <tr>
            <th scope="col">Email</th>
            <th scope="col">Role</th>
            <th scope="col">Joined</th>
            <th scope="col">
              <span className="visually-hidden">Actions</span>
            </th>
          </tr>
        </thead>
        <tbody>
          {members.map((m) => {
            const isMe = m.user_id === myUserId;
            return (
              <tr key={m.id} data-member={m.email}>
                <td>
                  {m.email} {isMe && <span className="badge badge-info">you</span>}
                </td>
                <td>
                  {isOwner ? (
                    <RoleSelect value={m.role} label={`Role of ${m.email}`} onChange={(role) => void onRoleChange(m, role)} />
                  ) : (
                    m.role
                  )}
                </td>
                <td>{formatDate(m.joined_at)}</td>
                <td className="actions">
                  {isMe ? (
                    <ConfirmButton confirmLabel="Leave now" onConfirm={() => onRemove(m)}>
                      Leave tenant
                    </ConfirmButton>
                  ) : (
                    isOwner && (
                      <ConfirmButton ariaLabel={`Remove ${m.email}`} confirmLabel="Remove now" onConfirm={() => onRemove(m)}>
                        Remove
                      </ConfirmButton>
                    )
                  )}
                </td>
              </tr>
            );
          })}
        </tbody>
      </table>
    </div>
  );
}

function InvitationTable({ invitations, isOwner, onRevoke }: { invitations: Invitation[]; isOwner: boolean; onRevoke: (i: Invitation) => Promise<void> }) {
  if (!invitations.length) return <Empty>No pending invitations.</Empty>;
  return (
    <div className="table-wrap">
      <table>
        <caption className="visually-hidden">Pending invitations</caption>
        <thead>
          <tr>
            <th scope="col">Email</th>
            <th scope="col">Role</th>
            <th scope="col">Invited by</th>
            <th scope="col">Created</th>
            <th scope="col">Expires</th>
            <th scope="col">
              <span className="visually-hidden">Actions</span>
            </th>
          </tr>
        </thead>
        <tbody>
          {invitations.map((i) => (
            <tr key={i.id} data-invitation={i.email}>
              <td>{i.email}</td>
              <td>{i.role}</td>
              <td>{i.invited_by ?? "—"}</td>
              <td>{formatDate(i.created_at)}</td>
              <td>{formatDate(i.expires_at)}</td>
              <td className="actions">
                {isOwner && (
                  <ConfirmButton ariaLabel={`Revoke invitation for ${i.email}`} confirmLabel="Revoke now" onConfirm={() => onRevoke(i)}>
                    Revoke
                  </ConfirmButton>
                )}
              </td>
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}

/** What an audit entry's detail says, in words (the raw JSON is kept in the title). */
function describeDetail(entry: AuditEntry): string {
  const detail = (entry.detail ?? {}) as Record<string, unknown>;
  if (entry.action === "member.role") return `${String(detail.old)} → ${String(detail.new)}`;
  if (entry.action === "quota.notice") {
    return `${String(detail.percent)}% of the monthly tokens used (${Number(detail.used).toLocaleString("en-US")} of ${Number(detail.limit).toLocaleString("en-US")}); owners mailed`;
  }
  if (typeof detail.role === "string") return `as ${detail.role}`;
  return "";
}

/** Owners only: the tenant's audit log (team changes, operators' KV evictions), newest first. */
function ActivityTable() {
  const entries = useAsync(listAuditLog);
  return (
    <AsyncBlock state={entries} label="Loading activity…">
      {(list) =>
        list.length === 0 ? (
          <Empty>Nothing recorded yet.</Empty>
        ) : (
          <div className="table-wrap">
            <table>
              <caption className="visually-hidden">Activity</caption>
              <thead>
                <tr>
                  <th scope="col">When</th>
                  <th scope="col">Who</th>
                  <th scope="col">Action</th>
                  <th scope="col">Target</th>
                  <th scope="col">Detail</th>
                </tr>
              </thead>
              <tbody>
                {list.map((e) => (
                  <tr key={e.id}>
                    <td>{formatDate(e.created_at)}</td>
                    <td>{e.actor ?? "operator"}</td>
                    <td>
                      <code>{e.action}</code>
                    </td>
                    <td>{e.target}</td>
                    <td title={JSON.stringify(e.detail)}>{describeDetail(e)}</td>
                  </tr>
                ))}
              </tbody>
            </table>
          </div>
        )
      }
    </AsyncBlock>
  );
}

/** Owners close the tenant: typing its slug arms the button, since closing deletes its programs,
 * runs, keys and KV files and cannot be undone. The console then moves on like after leaving. */
function CloseTenantForm({ tenantId, slug }: { tenantId: number; slug: string }) {
  const { closeTenant } = useAuth();
  const navigate = useNavigate();
  const [typed, setTyped] = useState("");
  const { busy, error, run } = useAction();
  const submit = async (e: FormEvent) => {
    e.preventDefault();
    if (await run(() => closeTenant(tenantId, typed.trim()))) navigate("/programs", { replace: true });
  };
  return (
    <form className="card form card-danger" onSubmit={submit} aria-labelledby="close-tenant-title">
      <h2 id="close-tenant-title">Close this tenant</h2>
      <p className="muted">
        Every API key stops working and running programs are stopped at once; all members lose access. Its programs, runs and KV
        files are then deleted. Usage so far is still billed, and the activity log is kept for the operator. This cannot be
        undone.
      </p>
      <ErrorBanner error={error} />
      <label className="field">
        <span>
          Type <code>{slug}</code> to confirm
        </span>
        <input type="text" autoComplete="off" value={typed} onChange={(e) => setTyped(e.target.value)} />
      </label>
      <button type="submit" className="btn btn-danger" disabled={busy || typed.trim() !== slug}>
        {busy ? "Closing…" : "Close tenant"}
      </button>
    </form>
  );
}

function TeamView() {
  const { me, activeTenant, refresh } = useAuth();
  const navigate = useNavigate();
  const members = useAsync(listMembers);
  const invitations = useAsync(listInvitations);
  const [created, setCreated] = useState<NewInvitation | null>(null);
  const [error, setError] = useState<unknown>(null);
  // Bumped after each change so the activity log (a separate request) shows it.
  const [changes, setChanges] = useState(0);
  const myUserId = me?.user?.id;
  const isOwner = activeTenant?.role === "owner";

  /** Run a team change; show its error on the page instead of throwing into ConfirmButton. */
  const attempt = async (change: () => Promise<void>) => {
    try {
      await change();
      setError(null);
      setChanges((n) => n + 1);
    } catch (err) {
      setError(err);
    }
  };
  const changeRole = (m: Member, role: Role) =>
    attempt(async () => {
      await setMemberRole(m.id, role);
      members.reload();
      // Stepping down changes what this console may show (owner controls), which comes from me.
      if (m.user_id === myUserId) await refresh();
    });
  const remove = (m: Member) =>
    attempt(async () => {
      await removeMember(m.id);
      if (m.user_id !== myUserId) {
        members.reload();
        return;
      }
      // Left: /auth/me now names another tenant as active, or none (the layout then offers to
      // create one); either way this tenant's team page no longer applies.
      await refresh();
      navigate("/programs", { replace: true });
    });
  const revoke = (i: Invitation) =>
    attempt(async () => {
      await revokeInvitation(i.id);
      invitations.reload();
    });

  return (
    <>
      <PageHeader title="Team">
        Who belongs to {activeTenant?.name ?? "this tenant"}. Owners invite people, change roles and remove members; removing someone
        also revokes the API keys they created here. Anyone may leave.
      </PageHeader>
      {created && <NewInvitationLink invitation={created} onDismiss={() => setCreated(null)} />}
      {isOwner && (
        <InviteForm
          onInvited={(invitation) => {
            setCreated(invitation);
            invitations.reload();
          }}
        />
      )}
      <ErrorBanner error={error} />
      <section aria-labelledby="members-title">
        <h2 id="members-title">Members</h2>
        <AsyncBlock state={members} label="Loading members…">
          {(list) => <MemberTable members={list} myUserId={myUserId} isOwner={isOwner} onRoleChange={changeRole} onRemove={remove} />}
        </AsyncBlock>
      </section>
      <section aria-labelledby="invitations-title">
        <h2 id="invitations-title">Pending invitations</h2>
        <AsyncBlock state={invitations} label="Loading invitations…">
          {(list) => <InvitationTable invitations={list} isOwner={isOwner} onRevoke={revoke} />}
        </AsyncBlock>
      </section>
      {isOwner && (
        <section aria-labelledby="activity-title">
          <h2 id="activity-title">Activity</h2>
          <ActivityTable key={`${changes}-${created?.id ?? ""}`} />
        </section>
      )}
      <ToolHostsCard isOwner={isOwner} />
      {isOwner && activeTenant && <CloseTenantForm tenantId={activeTenant.id} slug={activeTenant.slug} />}
    </>
  );
}

export function TeamPage() {
  const { me } = useAuth();
  // Remount per tenant: switching tenant must reload both lists and drop a link shown for the
  // previous one.
  return <TeamView key={me?.active_tenant ?? "none"} />;
}
