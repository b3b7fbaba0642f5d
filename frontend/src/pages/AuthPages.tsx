import { useState, type FormEvent } from "react";
import { Link, Navigate, useLocation, useNavigate } from "react-router";
import { useAuth } from "../auth/AuthContext";
import { fieldError } from "../api/errors";
import { CredentialFields, useSignInForm } from "../components/CredentialFields";
import { ErrorBanner, FieldError, Notice } from "../components/Status";

export function AuthCard({ title, children }: { title: string; children: React.ReactNode }) {
  return (
    <main className="auth-page" id="main">
      <section className="card auth-card" aria-labelledby="auth-title">
        <p className="brand">Symphony</p>
        <p className="tagline" data-testid="tagline">
          Run LLM inference programs: Python that drives the model token by token, streamed live, with KV files you keep
          and usage you can see.
        </p>
        <h1 id="auth-title">{title}</h1>
        {children}
      </section>
    </main>
  );
}

/** Where to go once signed in: the page that sent the user here (`from`), else Programs. */
function useAfterAuth() {
  const navigate = useNavigate();
  const location = useLocation();
  const from = (location.state as { from?: string } | null)?.from;
  const target = from && from !== "/login" ? from : "/programs";
  return { target, done: () => navigate(target, { replace: true }) };
}

export function LoginPage() {
  const { me, login } = useAuth();
  const { target, done } = useAfterAuth();
  // Set by a page that sends the user here with news, e.g. after a password reset.
  const notice = (useLocation().state as { notice?: string } | null)?.notice;
  const form = useSignInForm(async (email, password) => {
    await login(email, password);
    done();
  });
  const { email } = form.credentials;
  // Signing in sets `me`, which re-renders this page before done() runs: go to the same place.
  if (me) return <Navigate to={target} replace />;
  return (
    <AuthCard title="Log in">
      <form onSubmit={form.submit} className="form">
        {notice && <Notice tone="ok">{notice}</Notice>}
        <CredentialFields {...form.fields} />
        <button className="btn btn-primary" type="submit" disabled={form.busy}>
          {form.busy ? "Logging in…" : "Log in"}
        </button>
      </form>
      <p>
        {/* Passes on the address typed so far (not a username), so it need not be typed twice. */}
        <Link to="/forgot-password" state={{ email: email.includes("@") ? email : "" }}>
          Forgot your password?
        </Link>
      </p>
      <p>
        No account? <Link to="/signup">Sign up</Link>
      </p>
    </AuthCard>
  );
}

export function SignupPage() {
  const { me, signup } = useAuth();
  const { target, done } = useAfterAuth();
  const [email, setEmail] = useState("");
  const [password, setPassword] = useState("");
  const [tenant, setTenant] = useState("");
  const [error, setError] = useState<unknown>(null);
  const [busy, setBusy] = useState(false);
  const emailError = fieldError(error, "email");
  const passwordError = fieldError(error, "password");
  const tenantError = fieldError(error, "tenant_name");
  // Signing in sets `me`, which re-renders this page before done() runs: go to the same place.
  if (me) return <Navigate to={target} replace />;
  const submit = async (e: FormEvent) => {
    e.preventDefault();
    setBusy(true);
    try {
      await signup(email, password, tenant);
      done();
    } catch (err) {
      setError(err);
      setBusy(false);
    }
  };
  return (
    <AuthCard title="Create an account">
      <form onSubmit={submit} className="form">
        <ErrorBanner error={error} inline />
        <label className="field">
          Email
          <input
            type="email"
            autoComplete="email"
            required
            value={email}
            aria-invalid={emailError ? true : undefined}
            aria-describedby="signup-email-error"
            onChange={(e) => setEmail(e.target.value)}
          />
          <FieldError id="signup-email-error" message={emailError} />
        </label>
        <label className="field">
          Password
          <input
            type="password"
            autoComplete="new-password"
            minLength={8}
            required
            value={password}
            aria-invalid={passwordError ? true : undefined}
            aria-describedby="signup-password-hint signup-password-error"
            onChange={(e) => setPassword(e.target.value)}
          />
          <span className="hint" id="signup-password-hint">
            At least 8 characters; not a common password, not only digits, not close to your address.
          </span>
          <FieldError id="signup-password-error" message={passwordError} />
        </label>
        <label className="field">
          Organisation (tenant) name
          <input
            type="text"
            required
            maxLength={200}
            value={tenant}
            aria-invalid={tenantError ? true : undefined}
            aria-describedby="signup-tenant-error"
            onChange={(e) => setTenant(e.target.value)}
          />
          <FieldError id="signup-tenant-error" message={tenantError} />
        </label>
        <button className="btn btn-primary" type="submit" disabled={busy}>
          {busy ? "Creating…" : "Sign up"}
        </button>
      </form>
      <p>
        Already registered? <Link to="/login">Log in</Link>
      </p>
    </AuthCard>
  );
}
