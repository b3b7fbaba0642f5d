import { useState } from "react";
import { resendVerification } from "../api/endpoints";
import { useAuth } from "../auth/AuthContext";
import { ErrorBanner, Notice } from "./Status";

/** Shown on every console page until a sign-up opens the link mailed to its address: until then
 * the server refuses API keys, program uploads and runs (403 `email_unverified`). */
export function VerifyEmailBanner() {
  const { me } = useAuth();
  const [sent, setSent] = useState<string | null>(null);
  const [error, setError] = useState<unknown>(null);
  const [busy, setBusy] = useState(false);
  if (!me?.user || me.user.email_verified !== false) return null;
  const resend = async () => {
    setBusy(true);
    setError(null);
    try {
      setSent(await resendVerification());
    } catch (err) {
      setError(err);
    } finally {
      setBusy(false);
    }
  };
  return (
    <div data-testid="verify-email-banner">
      <Notice tone="warn">
        <span>
          Check your inbox to verify {me.user.email}. Until you open the link we mailed you, you cannot mint API keys, upload
          programs or start runs.
        </span>{" "}
        <button type="button" className="btn btn-small" onClick={() => void resend()} disabled={busy}>
          {busy ? "Sending…" : "Resend"}
        </button>
      </Notice>
      {sent && <Notice tone="ok">{sent}</Notice>}
      <ErrorBanner error={error} />
    </div>
  );
}
