import { useId, useState } from "react";
import { useAuth } from "../auth/AuthContext";
import { errorMessage } from "../api/errors";

/** Select of the user's tenants; shown as plain text when there is only one. */
export function TenantSwitcher() {
  const { me, switchTenant } = useAuth();
  const id = useId();
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  if (!me || me.tenants.length === 0) return null;
  if (me.tenants.length === 1) {
    return <span className="tenant-name" title="Tenant">{me.tenants[0].name}</span>;
  }
  return (
    <span className="tenant-switcher">
      <label htmlFor={id}>Tenant</label>
      <select
        id={id}
        value={me.active_tenant ?? ""}
        disabled={busy}
        onChange={async (e) => {
          setBusy(true);
          try {
            await switchTenant(Number(e.target.value));
            setError(null);
          } catch (err) {
            setError(errorMessage(err));
          } finally {
            setBusy(false);
          }
        }}
      >
        {me.tenants.map((t) => (
          <option key={t.id} value={t.id}>
            {t.name} ({t.role})
          </option>
        ))}
      </select>
      {error && <span role="alert" className="field-error">{error}</span>}
    </span>
  );
}
