import { useCallback, useState } from "react";

/**
 * Busy flag and error of a form's one action, so each form does not repeat the same
 * try/catch/finally: `run` reports whether the action succeeded, clears the error when it did
 * and keeps it for the page's ErrorBanner when it did not. `fail` shows a client-side error.
 */
export function useAction() {
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<unknown>(null);
  const run = useCallback(async (action: () => Promise<void>): Promise<boolean> => {
    setBusy(true);
    try {
      await action();
      setError(null);
      return true;
    } catch (err) {
      setError(err);
      return false;
    } finally {
      setBusy(false);
    }
  }, []);
  return { busy, error, run, fail: setError };
}
