import { useState, type FormEvent } from "react";
import { Link, useLocation, useNavigate, useParams } from "react-router";
import { getInvitation } from "../api/endpoints";
import { ApiError } from "../api/errors";
import type { InvitationPreview, Me } from "../api/types";
import { useAuth } from "../auth/AuthContext";
import { ErrorBanner, Loading, Notice } from "../components/Status";
import { useAsync, type AsyncState } from "../hooks/useAsync";
import { useAction } from "../hooks/useAction";
import { formatDate } from "../lib/format";
import { AuthCard } from "./AuthPages";

function InvitationSummary({ preview }: { preview: InvitationPreview }) {
  return (
    <p>
      {preview.invited_by ?? "An owner"} invited <strong>{preview.email}</strong> to join <strong>{preview.tenant_name}</strong> as{" "}
      <strong>{preview.role}</strong>. The link expires {formatDate(preview.expires_at)}.
    </p>
  );
}

/** Signed in: join with one click, unless the invitation is for another address. */
function AcceptInvitation({ token, preview, me }: { token: string; preview: InvitationPreview; me: Me }) {
  const { acceptInvitation, logout } = useAuth();
  const navigate = useNavigate();
  const { busy, error, run } = useAction();
  const email = me.user?.email ?? "";
  // The server refuses (403) a user whose email is not the invited one; say so up front.
  const otherAddress = email.toLowerCase() !== preview.email.toLowerCase();
  const accept = async () => {
    if (await run(() => acceptInvitation(token).then(() => undefined))) navigate("/programs", { replace: true });
  };
  return (
    <div className="form">
      <ErrorBanner error={error} />
      {otherAddress && (
        <Notice tone="warn">
          This invitation is for {preview.email}, but you are signed in as {email}. Log out, then sign in or sign up as{" "}
          {preview.email} to accept it.
        </Notice>
      )}
      <button type="button" className="btn btn-primary" disabled={busy || otherAddress} onClick={() => void accept()}>
        {busy ? "Joining…" : `Join ${preview.tenant_name} as ${preview.role}`}
      </button>
      {otherAddress && (
        <button type="button" className="btn btn-small" onClick={() => void logout()}>
          Log out
        </button>
      )}
    </div>
  );
}

/** Not signed in: create the invited account (it joins the tenant), or log in and come back. */
function SignupWithInvite({ token, preview }: { token: string; preview: InvitationPreview }) {
  const { signupWithInvite } = useAuth();
  const navigate = useNavigate();
  const location = useLocation();
  const [password, setPassword] = useState("");
  const { busy, error, run } = useAction();
  const submit = async (e: FormEvent) => {
    e.preventDefault();
    const joined = await run(() => signupWithInvite(preview.email, password, token).then(() => undefined));
    if (joined) navigate("/programs", { replace: true });
  };
  return (
    <>
      <form onSubmit={submit} className="form">
        <ErrorBanner error={error} />
        <label className="field">
          Email
          {/* Read-only: the invitation can only be accepted by this address. */}
          <input type="email" autoComplete="email" readOnly value={preview.email} />
        </label>
        <label className="field">
          Password
          <input type="password" autoComplete="new-password" minLength={8} required value={password} onChange={(e) => setPassword(e.target.value)} />
          <span className="hint">At least 8 characters.</span>
        </label>
        <button className="btn btn-primary" type="submit" disabled={busy}>
          {busy ? "Joining…" : "Sign up and join"}
        </button>
      </form>
      <p>
        Already have an account?{" "}
        {/* LoginPage returns to `from` after signing in, so the user lands back here to accept. */}
        <Link to="/login" state={{ from: location.pathname }}>
          Log in
        </Link>{" "}
        and you will come back here to join.
      </p>
    </>
  );
}

function InvalidInvitation({ signedIn }: { signedIn: boolean }) {
  return (
    <>
      <p role="alert">
        This invitation link is not valid: it may have been used already, revoked or replaced, or it has expired. Ask an owner of
        the tenant for a new link.
      </p>
      <p>{signedIn ? <Link to="/programs">Go to the console</Link> : <Link to="/login">Log in</Link>}</p>
    </>
  );
}

/** `/invite/:token`, outside RequireAuth: the link an owner passes on opens here. */
export function InvitePage() {
  const { token = "" } = useParams();
  const preview = useAsync(() => getInvitation(token), [token]);
  return (
    <AuthCard title={preview.data ? `Join ${preview.data.tenant_name}` : "Invitation"}>
      <InviteBody token={token} preview={preview} />
    </AuthCard>
  );
}

function InviteBody({ token, preview }: { token: string; preview: AsyncState<InvitationPreview> }) {
  const { me, loading } = useAuth();
  // 404 covers unknown, used, revoked and expired links alike (the server does not say which).
  if (preview.error instanceof ApiError && preview.error.status === 404) return <InvalidInvitation signedIn={Boolean(me?.user)} />;
  if (preview.error) return <ErrorBanner error={preview.error} onRetry={preview.reload} />;
  if (!preview.data || loading) return <Loading label="Loading invitation…" />;
  return (
    <>
      <InvitationSummary preview={preview.data} />
      {me?.user ? <AcceptInvitation token={token} preview={preview.data} me={me} /> : <SignupWithInvite token={token} preview={preview.data} />}
    </>
  );
}
