import { useState, type FormEvent } from "react";
import { useNavigate } from "react-router";
import { changePassword, requestEmailChange } from "../api/endpoints";
import { useAuth } from "../auth/AuthContext";
import { PageHeader } from "../components/PageHeader";
import { ErrorBanner, Notice } from "../components/Status";
import { useAction } from "../hooks/useAction";

/** Sign in with another address: the server mails a link to it, and only opening that link
 * (ConfirmEmailPage) makes the change, so the address shown here stays the old one until then. */
function EmailForm() {
  const { me } = useAuth();
  const [email, setEmail] = useState("");
  const [password, setPassword] = useState("");
  const [sentTo, setSentTo] = useState<string | null>(null);
  const { busy, error, run } = useAction();
  const submit = async (e: FormEvent) => {
    e.preventDefault();
    setSentTo(null);
    const address = email.trim();
    if (await run(() => requestEmailChange(address, password))) {
      setEmail("");
      setPassword("");
      setSentTo(address);
    }
  };
  return (
    <form className="card form" onSubmit={submit} aria-labelledby="email-title">
      <h2 id="email-title">Email address</h2>
      <p>
        You sign in with <strong data-testid="current-email">{me?.user?.email}</strong>.
      </p>
      <ErrorBanner error={error} />
      {sentTo !== null && (
        <Notice tone="ok">
          We sent a link to {sentTo}. Your address changes when you open it (valid 24 hours).
        </Notice>
      )}
      <div className="row">
        <label className="field grow">
          New email
          <input type="email" autoComplete="email" required maxLength={150} value={email} onChange={(e) => setEmail(e.target.value)} />
        </label>
        <label className="field grow">
          Current password
          <input type="password" autoComplete="current-password" required value={password} onChange={(e) => setPassword(e.target.value)} />
        </label>
      </div>
      <button type="submit" className="btn btn-primary" disabled={busy}>
        {busy ? "Sending…" : "Send confirmation link"}
      </button>
    </form>
  );
}

function PasswordForm() {
  const [current, setCurrent] = useState("");
  const [next, setNext] = useState("");
  const [confirm, setConfirm] = useState("");
  const [changed, setChanged] = useState(false);
  const { busy, error, run, fail } = useAction();
  const submit = async (e: FormEvent) => {
    e.preventDefault();
    setChanged(false);
    // Checked here because the server only ever sees one copy of the new password.
    if (next !== confirm) {
      fail(new Error("The new password and its confirmation do not match."));
      return;
    }
    const ok = await run(() => changePassword(current, next));
    if (ok) {
      setCurrent("");
      setNext("");
      setConfirm("");
      setChanged(true);
    }
  };
  return (
    <form className="card form" onSubmit={submit} aria-labelledby="password-title">
      <h2 id="password-title">Change password</h2>
      <ErrorBanner error={error} />
      {changed && <Notice tone="ok">Password changed. Your other sessions were signed out; this one stays signed in.</Notice>}
      <label className="field">
        Current password
        <input type="password" autoComplete="current-password" required value={current} onChange={(e) => setCurrent(e.target.value)} />
      </label>
      <div className="row">
        <label className="field grow">
          New password
          <input type="password" autoComplete="new-password" minLength={8} required value={next} onChange={(e) => setNext(e.target.value)} />
          <span className="hint">At least 8 characters.</span>
        </label>
        <label className="field grow">
          Confirm new password
          <input type="password" autoComplete="new-password" required value={confirm} onChange={(e) => setConfirm(e.target.value)} />
        </label>
      </div>
      <button type="submit" className="btn btn-primary" disabled={busy}>
        {busy ? "Changing…" : "Change password"}
      </button>
    </form>
  );
}

/** Create a tenant owned by the signed-in user; the console switches to it. Also shown to a
 * user who belongs to no tenant (NoTenantPage). */
export function CreateTenantForm() {
  const { createTenant } = useAuth();
  const navigate = useNavigate();
  const [name, setName] = useState("");
  const { busy, error, run } = useAction();
  const submit = async (e: FormEvent) => {
    e.preventDefault();
    if (await run(() => createTenant(name).then(() => undefined))) navigate("/programs");
  };
  return (
    <form className="card form" onSubmit={submit} aria-labelledby="create-tenant-title">
      <h2 id="create-tenant-title">Create a tenant</h2>
      <p className="muted">
        A tenant has its own programs, runs, KV files, API keys and quota. You become its owner and the console switches to it.
      </p>
      <ErrorBanner error={error} />
      <label className="field">
        Tenant name
        <input type="text" required maxLength={200} value={name} onChange={(e) => setName(e.target.value)} />
      </label>
      <button type="submit" className="btn btn-primary" disabled={busy}>
        {busy ? "Creating…" : "Create tenant"}
      </button>
    </form>
  );
}

export function AccountPage() {
  const { me } = useAuth();
  return (
    <>
      <PageHeader title="Account">Signed in as {me?.user?.email}.</PageHeader>
      <EmailForm />
      <PasswordForm />
      <CreateTenantForm />
    </>
  );
}
