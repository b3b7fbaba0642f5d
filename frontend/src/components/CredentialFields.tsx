import { useState, type FormEvent } from "react";
import { ErrorBanner } from "./Status";

/** What a sign-in sends: the address or username, and the password. */
export interface Credentials {
  email: string;
  password: string;
}

/** The state of a sign-in form: what was typed, the refusal of the last try, and whether one is
 * under way. `signIn` does the signing in (and whatever follows it); a refusal it throws is shown
 * until the user types again, since it was about what was typed before. */
export function useSignInForm(signIn: (email: string, password: string) => Promise<void>, initialEmail = "") {
  const [credentials, setCredentials] = useState<Credentials>({ email: initialEmail, password: "" });
  const [error, setError] = useState<unknown>(null);
  const [busy, setBusy] = useState(false);
  const submit = async (e: FormEvent) => {
    e.preventDefault();
    setBusy(true);
    try {
      await signIn(credentials.email, credentials.password);
    } catch (err) {
      setError(err);
      setBusy(false);
    }
  };
  const onChange = (next: Credentials) => {
    setCredentials(next);
    setError(null);
  };
  return { credentials, busy, submit, fields: { value: credentials, error, onChange } };
}

/** The email-or-username and password fields of every sign-in (the login page, the dialog over
 * a page whose session ended), with the refusal above them, so both ask the same way: the same
 * labels and autocomplete hints for password managers, and the cursor in the first field that
 * is still empty when the form appears. */
export function CredentialFields({
  value,
  error,
  onChange,
}: {
  value: Credentials;
  error: unknown;
  onChange: (next: Credentials) => void;
}) {
  // Decided once, when the form appears: the dialog knows the address and asks for the password.
  const [focusPassword] = useState(() => value.email !== "");
  return (
    <>
      <ErrorBanner error={error} />
      <label className="field">
        Email or username
        <input
          type="text"
          autoComplete="username"
          autoCapitalize="none"
          spellCheck={false}
          required
          autoFocus={!focusPassword}
          value={value.email}
          onChange={(e) => onChange({ ...value, email: e.target.value })}
        />
      </label>
      <label className="field">
        Password
        <input
          type="password"
          autoComplete="current-password"
          required
          autoFocus={focusPassword}
          value={value.password}
          onChange={(e) => onChange({ ...value, password: e.target.value })}
        />
      </label>
    </>
  );
}
