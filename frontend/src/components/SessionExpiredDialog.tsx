import { useState, type FormEvent } from "react";
import { SESSION_EXPIRED } from "../api/errors";
import { useAuth } from "../auth/AuthContext";
import { ErrorBanner } from "./Status";

/** Over the page whose request found the session ended: sign in again right here, so the page
 * underneath (its route, its half-filled form) is still there afterwards. */
export function SessionExpiredDialog() {
  const { me, renewSession, logout } = useAuth();
  const [email, setEmail] = useState(me?.user?.email ?? "");
  const [password, setPassword] = useState("");
  const [error, setError] = useState<unknown>(null);
  const [busy, setBusy] = useState(false);
  const submit = async (e: FormEvent) => {
    e.preventDefault();
    setBusy(true);
    try {
      await renewSession(email, password);
    } catch (err) {
      setError(err);
      setBusy(false);
    }
  };
  return (
    <div className="modal-backdrop">
      <section className="card modal" role="alertdialog" aria-modal="true" aria-labelledby="session-expired-title">
        <h2 id="session-expired-title">{SESSION_EXPIRED}</h2>
        <p className="muted">What you were doing stays on the page; send it again once signed in.</p>
        <form onSubmit={submit} className="form">
          <ErrorBanner error={error} />
          <label className="field">
            Email or username
            <input
              type="text"
              autoComplete="username"
              autoCapitalize="none"
              spellCheck={false}
              required
              value={email}
              onChange={(e) => {
                setEmail(e.target.value);
                setError(null);
              }}
            />
          </label>
          <label className="field">
            Password
            <input
              type="password"
              autoComplete="current-password"
              required
              autoFocus
              value={password}
              onChange={(e) => {
                setPassword(e.target.value);
                setError(null);
              }}
            />
          </label>
          <div className="form-actions">
            <button className="btn btn-primary" type="submit" disabled={busy}>
              {busy ? "Signing in…" : "Sign in"}
            </button>
            <button type="button" className="btn" onClick={() => void logout()}>
              Log out
            </button>
          </div>
        </form>
      </section>
    </div>
  );
}
