import { useState, type ReactNode } from "react";

interface ConfirmButtonProps {
  onConfirm: () => Promise<void> | void;
  children: ReactNode;
  confirmLabel?: string;
  className?: string;
  ariaLabel?: string;
  /** The button that backs out (say what stays, where "Cancel" would read as the action). */
  keepLabel?: string;
}

/** A destructive action that asks once inline ("Confirm?") before running. */
export function ConfirmButton({ onConfirm, children, confirmLabel = "Confirm", className = "btn btn-small btn-danger", ariaLabel, keepLabel = "Cancel" }: ConfirmButtonProps) {
  const [armed, setArmed] = useState(false);
  const [busy, setBusy] = useState(false);
  if (!armed) {
    return (
      <button type="button" className={className} aria-label={ariaLabel} onClick={() => setArmed(true)}>
        {children}
      </button>
    );
  }
  return (
    <span className="confirm">
      <button
        type="button"
        className={className}
        disabled={busy}
        onClick={async () => {
          setBusy(true);
          try {
            await onConfirm();
          } finally {
            setBusy(false);
            setArmed(false);
          }
        }}
      >
        {busy ? "Working…" : confirmLabel}
      </button>
      <button type="button" className="btn btn-small" onClick={() => setArmed(false)} disabled={busy}>
        {keepLabel}
      </button>
    </span>
  );
}
