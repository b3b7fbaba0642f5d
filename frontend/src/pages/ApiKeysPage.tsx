import { useState, type FormEvent } from "react";
import { createApiKey, listApiKeys, revokeApiKey } from "../api/endpoints";
import { KEY_SCOPES, type ApiKey, type KeyScope, type NewApiKey } from "../api/types";
import { ConfirmButton } from "../components/ConfirmButton";
import { CopyButton } from "../components/CopyButton";
import { PageHeader } from "../components/PageHeader";
import { AsyncBlock, Empty, ErrorBanner } from "../components/Status";
import { useAsync } from "../hooks/useAsync";
import { useAction } from "../hooks/useAction";
import { formatDate } from "../lib/format";

function NewKeySecret({ apiKey, onDismiss }: { apiKey: NewApiKey; onDismiss: () => void }) {
  return (
    <div className="card secret" role="region" aria-labelledby="secret-title">
      <h2 id="secret-title">New key “{apiKey.name}”</h2>
      <p>Copy the secret now: it is shown only once and cannot be recovered.</p>
      <div className="secret-row">
        <code data-testid="api-key-secret">{apiKey.secret}</code>
        <CopyButton text={apiKey.secret} label="Copy secret" />
      </div>
      <button type="button" className="btn btn-small" onClick={onDismiss}>
        I have stored it
      </button>
    </div>
  );
}

function CreateKeyForm({ onCreated }: { onCreated: (key: NewApiKey) => void }) {
  const [name, setName] = useState("");
  const [scopes, setScopes] = useState<KeyScope[]>([...KEY_SCOPES]);
  const { busy, error, run } = useAction();
  const submit = async (e: FormEvent) => {
    e.preventDefault();
    await run(async () => {
      if (!scopes.length) throw new Error("Choose at least one scope");
      onCreated(await createApiKey(name, scopes));
      // The next key starts from the defaults, not from this one's choices.
      setName("");
      setScopes([...KEY_SCOPES]);
    });
  };
  return (
    <form className="card form" onSubmit={submit} aria-labelledby="create-key-title">
      <h2 id="create-key-title">Create a key</h2>
      <ErrorBanner error={error} />
      <div className="row">
        <label className="field grow">
          Name
          <input type="text" required maxLength={100} value={name} onChange={(e) => setName(e.target.value)} />
        </label>
        <fieldset className="field grow scopes">
          <legend>Scopes</legend>
          {KEY_SCOPES.map((scope) => (
            <label key={scope} className="check">
              <input
                type="checkbox"
                checked={scopes.includes(scope)}
                onChange={(e) => setScopes((cur) => (e.target.checked ? [...cur, scope] : cur.filter((s) => s !== scope)))}
              />{" "}
              {scope}
            </label>
          ))}
        </fieldset>
      </div>
      <button type="submit" className="btn btn-primary" disabled={busy}>
        {busy ? "Creating…" : "Create key"}
      </button>
    </form>
  );
}

function KeyTable({ keys, onRevoke }: { keys: ApiKey[]; onRevoke: (k: ApiKey) => Promise<void> }) {
  if (!keys.length) return <Empty>No API keys yet. Create one above to call the REST API or the symphony CLI from a script.</Empty>;
  return (
    <div className="table-wrap">
      <table>
        <caption className="visually-hidden">API keys</caption>
        <thead>
          <tr>
            <th scope="col">Prefix</th>
            <th scope="col">Name</th>
            <th scope="col">Scopes</th>
            <th scope="col">Created</th>
            <th scope="col">Last used</th>
            <th scope="col">State</th>
            <th scope="col">
              <span className="visually-hidden">Actions</span>
            </th>
          </tr>
        </thead>
        <tbody>
          {keys.map((k) => (
            <tr key={k.id} data-prefix={k.prefix}>
              <td className="mono">sk_{k.prefix}_…</td>
              <td>{k.name}</td>
              <td>{(k.scopes ?? []).join(", ") || "—"}</td>
              <td>{formatDate(k.created_at)}</td>
              <td>{formatDate(k.last_used_at)}</td>
              <td>{k.revoked_at ? <span className="badge badge-bad">revoked</span> : <span className="badge badge-ok">active</span>}</td>
              <td className="actions">
                {!k.revoked_at && (
                  <ConfirmButton ariaLabel={`Revoke ${k.name}`} confirmLabel="Revoke now" onConfirm={() => onRevoke(k)}>
                    Revoke
                  </ConfirmButton>
                )}
              </td>
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}

export function ApiKeysPage() {
  const keys = useAsync(listApiKeys);
  const [created, setCreated] = useState<NewApiKey | null>(null);
  const [error, setError] = useState<unknown>(null);
  return (
    <>
      <PageHeader title="API keys">
        Keys authenticate the REST API and CLI (<code>Authorization: Bearer sk_…</code>). Only a prefix is stored in clear.
      </PageHeader>
      {created && <NewKeySecret apiKey={created} onDismiss={() => setCreated(null)} />}
      <CreateKeyForm
        onCreated={(k) => {
          setCreated(k);
          keys.reload();
        }}
      />
      <ErrorBanner error={error} />
      <section aria-labelledby="keys-title">
        <h2 id="keys-title">Keys</h2>
        <AsyncBlock state={keys} label="Loading keys…">
          {(list) => (
            <KeyTable
              keys={list}
              onRevoke={async (k) => {
                try {
                  await revokeApiKey(k.id);
                  setError(null);
                  keys.reload();
                } catch (err) {
                  setError(err);
                }
              }}
            />
          )}
        </AsyncBlock>
      </section>
    </>
  );
}
