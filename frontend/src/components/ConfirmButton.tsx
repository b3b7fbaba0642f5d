import { useState, type ReactNode } from "react";

interface ConfirmButtonProps {
  onConfirm: () => Promise<void> | void;
  children: ReactNode;
  confirmLabel?: string;
  className?: string;
  ariaLabel?: string;
}

/** A destructive action that asks once inline ("Confirm?") before running. */
export function ConfirmButton({ onConfirm, children, confirmLabel = "Confirm", className = "btn btn-small btn-danger", ariaLabel }: ConfirmButtonProps) {
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
        Cancel
      </button>
    </span>
  );
}
