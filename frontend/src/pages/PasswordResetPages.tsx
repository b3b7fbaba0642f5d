import { useState, type FormEvent } from "react";
import { Link, useLocation, useNavigate, useParams } from "react-router";
import { confirmPasswordReset, requestPasswordReset } from "../api/endpoints";
import { ApiError } from "../api/errors";
import { useAuth } from "../auth/AuthContext";
import { ErrorBanner, Notice } from "../components/Status";
import { useAction } from "../hooks/useAction";
import { AuthCard } from "./AuthPages";

/** What the login page shows after a reset (router state `notice`, see LoginPage). */
export const PASSWORD_CHANGED_NOTICE = "Your password was changed. Log in with the new one.";

/** How long a reset link lasts, in words (the server's SYMPHONY_PASSWORD_RESET_S). */
export function validity(minutes: number): string {
  if (minutes === 60) return "an hour";
  if (minutes % 60 === 0) return `${minutes / 60} hours`;
  return minutes === 1 ? "a minute" : `${minutes} minutes`;
}

/** `/forgot-password`: mail a reset link. The server answers alike whether or not an account
 * uses the address, so the confirmation says "if". */
export function ForgotPasswordPage() {
  const location = useLocation();
  // The login page passes on what was typed in its email field.
  const [email, setEmail] = useState((location.state as { email?: string } | null)?.email ?? "");
  const [sentTo, setSentTo] = useState<string | null>(null);
  const [validMinutes, setValidMinutes] = useState<number | null>(null);
  const { busy, error, run } = useAction();
  const submit = async (e: FormEvent) => {
    e.preventDefault();
    const address = email.trim();
    const sent = await run(async () => setValidMinutes(await requestPasswordReset(address)));
    if (sent) setSentTo(address);
  };
  return (
    <AuthCard title="Reset your password">
      {sentTo !== null ? (
        <Notice tone="ok">
          If an account uses {sentTo}, we sent a link to reset its password.{validMinutes !== null && ` It is valid for ${validity(validMinutes)}.`}
        </Notice>
      ) : (
        <form onSubmit={submit} className="form">
          <p className="muted">Enter the email address of your account and we will mail you a link to choose a new password.</p>
          <ErrorBanner error={error} />
          <label className="field">
            Email
            <input type="email" autoComplete="email" required maxLength={150} value={email} onChange={(e) => setEmail(e.target.value)} />
          </label>
          <button className="btn btn-primary" type="submit" disabled={busy}>
            {busy ? "Sending…" : "Send reset link"}
          </button>
        </form>
      )}
      <p>
        <Link to="/login">Back to Log in</Link>
      </p>
    </AuthCard>
  );
}

/** The server's word on a dead mailed link (a 400 with `detail.token`: bad, used or expired, it
 * does not say which), or null. Also used by ConfirmEmailPage. */
export function linkProblem(err: unknown): string | null {
  if (!(err instanceof ApiError) || err.status !== 400) return null;
  const token = (err.detail as { token?: unknown } | null)?.token;
  if (!token) return null;
  return Array.isArray(token) ? token.join(" ") : String(token);
}

function InvalidResetLink({ message }: { message: string }) {
  return (
    <>
      <p role="alert">{message}</p>
      <p>
        <Link to="/forgot-password">Ask for a new link</Link>
      </p>
    </>
  );
}

/** `/reset-password/:uid/:token`, the link of the reset mail: choose a new password. */
export function ResetPasswordPage() {
  const { uid = "", token = "" } = useParams();
  const { refresh } = useAuth();
  const navigate = useNavigate();
  const [password, setPassword] = useState("");
  const [confirm, setConfirm] = useState("");
  const [revokeKeys, setRevokeKeys] = useState(true);
  const { busy, error, run, fail } = useAction();
  const deadLink = linkProblem(error);
  const submit = async (e: FormEvent) => {
    e.preventDefault();
    // Checked here because the server only ever sees one copy of the new password.
    if (password.length < 8) {
      fail(new Error("The new password must have at least 8 characters."));
      return;
    }
    if (password !== confirm) {
      fail(new Error("The new password and its confirmation do not match."));
      return;
    }
    if (!(await run(() => confirmPasswordReset(uid, token, password, revokeKeys)))) return;
    // Every session of the account ended with the old password: a console signed in here
    // would show stale state, so re-read /auth/me before the login page decides what to show.
    await refresh();
    navigate("/login", { replace: true, state: { notice: PASSWORD_CHANGED_NOTICE } });
  };
  return (
    <AuthCard title="Choose a new password">
      {deadLink ? (
        <InvalidResetLink message={deadLink} />
      ) : (
        <form onSubmit={submit} className="form">
          <ErrorBanner error={error} />
          <label className="field">
            New password
            <input type="password" autoComplete="new-password" minLength={8} required value={password} onChange={(e) => setPassword(e.target.value)} />
            <span className="hint">At least 8 characters, not a common password and not all digits.</span>
          </label>
          <label className="field">
            Confirm new password
            <input type="password" autoComplete="new-password" required value={confirm} onChange={(e) => setConfirm(e.target.value)} />
          </label>
          <label className="field">
            <span>
              <input type="checkbox" checked={revokeKeys} onChange={(e) => setRevokeKeys(e.target.checked)} /> Revoke every API key
              this account minted before now
            </span>
            <span className="hint">Recommended: whoever had your password may have minted one. Every session ends either way.</span>
          </label>
          <button className="btn btn-primary" type="submit" disabled={busy}>
            {busy ? "Saving…" : "Set new password"}
          </button>
        </form>
      )}
    </AuthCard>
  );
}
