import { useEffect, useRef, type ReactNode } from "react";
import { ApiError, errorMessage, isSessionExpired } from "../api/errors";
import { onSessionRenewed } from "../auth/sessionExpiry";

/** A field's own error, under it; `id` is what the input's aria-describedby names. */
export function FieldError({ id, message }: { id: string; message: string | null }) {
  return (
    <span className="field-error" id={id} role={message ? "alert" : undefined}>
      {message ?? ""}
    </span>
  );
}

export function Loading({ label = "Loading…" }: { label?: string }) {
  return (
    <p className="loading" role="status" aria-live="polite">
      <span className="spinner" aria-hidden="true" /> {label}
    </p>
  );
}

/** `inline`: the form shows each field's message next to the field (FieldError), so a 400
 * naming fields only says so here. */
export function ErrorBanner({ error, onRetry, inline = false }: { error: unknown; onRetry?: () => void; inline?: boolean }) {
  if (!error) return null;
  const text = inline && error instanceof ApiError && error.hasFieldErrors ? "Please fix the fields marked below." : errorMessage(error);
  return (
    <div className="banner banner-error" role="alert">
      <span>{text}</span>
      {/* Retrying cannot help an ended session: the sign-in dialog says what to do instead. */}
      {onRetry && !isSessionExpired(error) && (
        <button type="button" className="btn btn-small" onClick={onRetry}>
          Retry
        </button>
      )}
    </div>
  );
}

export function Notice({ children, tone = "info" }: { children: ReactNode; tone?: "info" | "warn" | "ok" }) {
  return (
    <div className={`banner banner-${tone}`} role="status">
      {children}
    </div>
  );
}

export function Empty({ children }: { children: ReactNode }) {
  return <div className="empty">{children}</div>;
}

interface AsyncBlockProps<T> {
  state: { data: T | undefined; error: unknown; loading: boolean; reload: () => void };
  children: (data: T) => ReactNode;
  label?: string;
}

/** Loading → error (with retry) → content; keeps showing stale data while reloading. A load
 * refused because the session ended is retried once the user has signed in again. */
export function AsyncBlock<T>({ state, children, label }: AsyncBlockProps<T>) {
  const latest = useRef(state);
  latest.current = state;
  useEffect(
    () =>
      onSessionRenewed(() => {
        if (isSessionExpired(latest.current.error)) latest.current.reload();
      }),
    [],
  );
  if (state.error) return <ErrorBanner error={state.error} onRetry={state.reload} />;
  if (state.data === undefined) return state.loading ? <Loading label={label} /> : null;
  return <>{children(state.data)}</>;
}
