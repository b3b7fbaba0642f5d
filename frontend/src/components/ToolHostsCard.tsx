import { useState, type FormEvent } from "react";
import { getToolHosts, setToolHosts, type ToolHosts } from "../api/endpoints";
import { useAsync } from "../hooks/useAsync";
import { useAction } from "../hooks/useAction";
import { AsyncBlock, ErrorBanner } from "./Status";

function Editor({ initial, isOwner }: { initial: ToolHosts; isOwner: boolean }) {
  const [saved, setSaved] = useState(initial);
  const [text, setText] = useState(initial.hosts.join("\n"));
  const { busy, error, run } = useAction();
  const entries = text
    .split(/[\s,]+/)
    .map((h) => h.trim())
    .filter(Boolean);
  const onSubmit = (e: FormEvent) => {
    e.preventDefault();
    void run(async () => {
      const next = await setToolHosts(entries);
      setSaved(next);
      setText(next.hosts.join("\n"));
    });
  };
  if (!isOwner) {
    return saved.hosts.length === 0 ? (
      <p className="muted">No tool hosts: programs cannot use http_fetch. An owner can add some.</p>
    ) : (
      <ul data-testid="tool-hosts">
        {saved.hosts.map((h) => (
          <li key={h} className="mono">
            {h}
          </li>
        ))}
      </ul>
    );
  }
  return (
    <form className="card form" onSubmit={onSubmit} aria-labelledby="tool-hosts-title">
      <ErrorBanner error={error} />
      <label className="field">
        Hosts (one per line: host or host:port)
        <textarea
          className="mono"
          rows={Math.min(10, Math.max(3, entries.length + 1))}
          value={text}
          aria-describedby="tool-hosts-count"
          onChange={(e) => setText(e.target.value)}
        />
        <span className="hint" id="tool-hosts-count" data-testid="tool-hosts-count">
          {saved.hosts.length} of {saved.max_hosts} allowed by the plan
        </span>
      </label>
      <div className="form-actions">
        <button type="submit" className="btn" disabled={busy || entries.length > saved.max_hosts}>
          {busy ? "Saving…" : "Save tool hosts"}
        </button>
      </div>
    </form>
  );
}

/** Hosts the tenant's programs may reach with `http_fetch`; a run's `limits.allowed_hosts`
 *  may only narrow this list. Owners edit it within the plan's bound. */
export function ToolHostsCard({ isOwner }: { isOwner: boolean }) {
  const state = useAsync(() => getToolHosts(), []);
  return (
    <section aria-labelledby="tool-hosts-title">
      <h2 id="tool-hosts-title">Tool hosts</h2>
      <p className="muted">
        Hosts this tenant&apos;s programs may reach with <span className="mono">http_fetch</span>. A run&apos;s{" "}
        <span className="mono">limits.allowed_hosts</span> may narrow the list; naming a host outside it is refused.
      </p>
      <AsyncBlock state={state} label="Loading tool hosts…">
        {(hosts) => <Editor initial={hosts} isOwner={isOwner} />}
      </AsyncBlock>
    </section>
  );
}
