import { useEffect, useRef, useState } from "react";
import { Link, useParams } from "react-router";
import { confirmEmailChange } from "../api/endpoints";
import { ApiError } from "../api/errors";
import { useAuth } from "../auth/AuthContext";
import { ErrorBanner, Loading, Notice } from "../components/Status";
import { AuthCard } from "./AuthPages";
import { linkProblem } from "./PasswordResetPages";

type Outcome = { email: string; error?: undefined } | { email?: undefined; error: unknown };

/** `/confirm-email/:token`, the link of the "confirm your new address" mail, outside RequireAuth:
 * it works signed out as well as signed in (the token is the credential). Opening it makes the
 * change at once; there is nothing to fill in. */
export function ConfirmEmailPage() {
  const { token = "" } = useParams();
  const { me, refresh } = useAuth();
  const [outcome, setOutcome] = useState<Outcome | null>(null);
  const [attempt, setAttempt] = useState(0);
  // The link works once, and StrictMode runs an effect twice on mount: a second POST would be
  // answered "already used". Both runs share the one request kept here (per token and retry).
  const pending = useRef<{ key: string; promise: Promise<string> } | null>(null);

  useEffect(() => {
    const key = `${attempt}:${token}`;
    if (pending.current?.key !== key) {
      pending.current = {
        key,
        // Re-read /auth/me before showing the outcome, so a signed-in console (its header, the
        // Account page) shows the new address and the right link is offered below.
        promise: confirmEmailChange(token).then(async (email) => {
          await refresh();
          return email;
        }),
      };
    }
    let live = true;
    pending.current.promise.then(
      (email) => live && setOutcome({ email }),
      (error: unknown) => live && setOutcome({ error }),
    );
    return () => {
      live = false;
    };
  }, [token, attempt, refresh]);

  const retry = () => {
    setOutcome(null);
    setAttempt((n) => n + 1);
  };
  return (
    <AuthCard title="Confirm your new email address">
      {outcome === null ? (
        <Loading label="Confirming your new address…" />
      ) : outcome.error === undefined ? (
        <>
          <Notice tone="ok">Your account now signs in with {outcome.email}.</Notice>
          <p>{me?.user ? <Link to="/programs">Go to Programs</Link> : <Link to="/login">Log in</Link>}</p>
        </>
      ) : (
        <ConfirmFailed error={outcome.error} onRetry={retry} />
      )}
    </AuthCard>
  );
}

function ConfirmFailed({ error, onRetry }: { error: unknown; onRetry: () => void }) {
  const deadLink = linkProblem(error);
  // Worth another try: throttled, mail or database trouble, a dropped connection. Not a refusal
  // (400, or 409 when another account took the address meanwhile).
  const transient = !(error instanceof ApiError) || error.status === 429 || error.status >= 500;
  return (
    <>
      {deadLink ? <p role="alert">{deadLink}</p> : <ErrorBanner error={error} onRetry={transient ? onRetry : undefined} />}
      <p>
        <Link to="/account">Ask for a new link on your Account page</Link>
      </p>
    </>
  );
}
