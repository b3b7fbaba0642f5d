import { useEffect, useRef, useState } from "react";
import { Link, useParams } from "react-router";
import { verifyEmail } from "../api/endpoints";
import { ApiError } from "../api/errors";
import { useAuth } from "../auth/AuthContext";
import { ErrorBanner, Loading, Notice } from "../components/Status";
import { AuthCard } from "./AuthPages";
import { linkProblem } from "./PasswordResetPages";

type Outcome = { email: string; error?: undefined } | { email?: undefined; error: unknown };

/** `/verify-email/:token`, the link of the sign-up's "verify your address" mail, outside
 * RequireAuth: it works signed out (another device) as well as signed in (the token is the
 * credential). Opening it verifies the address at once. */
export function VerifyEmailPage() {
  const { token = "" } = useParams();
  const { me, refresh } = useAuth();
  const [outcome, setOutcome] = useState<Outcome | null>(null);
  const [attempt, setAttempt] = useState(0);
  // The link works once and StrictMode runs an effect twice: both runs share one request.
  const pending = useRef<{ key: string; promise: Promise<string> } | null>(null);

  useEffect(() => {
    const key = `${attempt}:${token}`;
    if (pending.current?.key !== key) {
      pending.current = {
        key,
        // Re-read /auth/me so a signed-in console drops its "check your inbox" banner.
        promise: verifyEmail(token).then(async (email) => {
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

  const deadLink = outcome?.error === undefined ? null : linkProblem(outcome.error);
  const transient =
    outcome?.error !== undefined && (!(outcome.error instanceof ApiError) || outcome.error.status === 429 || outcome.error.status >= 500);
  return (
    <AuthCard title="Verify your email address">
      {outcome === null ? (
        <Loading label="Verifying your address…" />
      ) : outcome.error === undefined ? (
        <>
          <Notice tone="ok">{outcome.email} is verified: you can now mint API keys, upload programs and start runs.</Notice>
          <p>{me?.user ? <Link to="/programs">Go to Programs</Link> : <Link to="/login">Log in</Link>}</p>
        </>
      ) : (
        <>
          {deadLink ? (
            <p role="alert">{deadLink}</p>
          ) : (
            <ErrorBanner
              error={outcome.error}
              onRetry={
                transient
                  ? () => {
                      setOutcome(null);
                      setAttempt((n) => n + 1);
                    }
                  : undefined
              }
            />
          )}
          <p>{me?.user ? <Link to="/programs">Back to the console (Resend is at the top)</Link> : <Link to="/login">Log in</Link>}</p>
        </>
      )}
    </AuthCard>
  );
}
