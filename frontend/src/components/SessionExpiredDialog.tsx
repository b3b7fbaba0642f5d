import { SESSION_EXPIRED } from "../api/errors";
import { useAuth } from "../auth/AuthContext";
import { CredentialFields, useSignInForm } from "./CredentialFields";

/** Over the page whose request found the session ended: sign in again right here, so the page
 * underneath (its route, its half-filled form) is still there afterwards. */
export function SessionExpiredDialog() {
  const { me, renewSession, logout } = useAuth();
  const form = useSignInForm(renewSession, me?.user?.email ?? "");
  return (
    <div className="modal-backdrop">
      <section className="card modal" role="alertdialog" aria-modal="true" aria-labelledby="session-expired-title">
        <h2 id="session-expired-title">{SESSION_EXPIRED}</h2>
        <p className="muted">What you were doing stays on the page; send it again once signed in.</p>
        <form onSubmit={form.submit} className="form">
          <CredentialFields {...form.fields} />
          <div className="form-actions">
            <button className="btn btn-primary" type="submit" disabled={form.busy}>
              {form.busy ? "Signing in…" : "Sign in"}
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
