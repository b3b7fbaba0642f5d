import { useEffect, useState } from "react";
import { Link, useSearchParams } from "react-router";
import { listPrograms, listRuns } from "../api/endpoints";
import { TERMINAL_STATUSES, type Run } from "../api/types";
import { PageHeader } from "../components/PageHeader";
import { AsyncBlock, Empty } from "../components/Status";
import { StatusBadge } from "../components/StatusBadge";
import { useAsync } from "../hooks/useAsync";
import { formatDate, formatDuration } from "../lib/format";

/** How often the list asks again while any run on it is queued or running. */
export const RUNS_POLL_MS = 2000;
const STATUSES = ["queued", "running", "succeeded", "failed", "cancelled", "timed_out"];

export function RunTable({ runs, empty }: { runs: Run[]; empty?: React.ReactNode }) {
  if (!runs.length) return <Empty>{empty ?? "No runs yet."}</Empty>;
  return (
    <div className="table-wrap">
      <table>
        <caption className="visually-hidden">Runs</caption>
        <thead>
          <tr>
            <th scope="col">Run</th>
            <th scope="col">Program</th>
            <th scope="col">Status</th>
            <th scope="col">Created</th>
            <th scope="col">Duration</th>
          </tr>
        </thead>
        <tbody>
          {runs.map((r) => (
            <tr key={r.id}>
              <td>
                <Link to={`/runs/${r.id}`} className="mono">
                  {r.id.slice(0, 8)}
                </Link>
                {r.name && (
                  <span className="run-name truncate" title={r.name} data-testid="run-name">
                    {r.name}
                  </span>
                )}
              </td>
              <td>
                <Link to={`/programs/${r.program}`} className="truncate" title={r.program_name ?? undefined}>
                  {r.program_name ?? `#${r.program}`}
                </Link>{" "}
                <span className="muted">v{r.version}</span>
              </td>
              <td>
                <StatusBadge status={r.status} />
              </td>
              <td>{formatDate(r.created_at)}</td>
              <td>{r.started_at ? formatDuration(r.started_at, r.finished_at) : "—"}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}

/** Call `reload` every RUNS_POLL_MS while `active` and the tab is visible. */
export function usePolling(reload: () => void, active: boolean): void {
  useEffect(() => {
    if (!active) return;
    const timer = window.setInterval(() => {
      if (document.visibilityState !== "hidden") reload();
    }, RUNS_POLL_MS);
    return () => window.clearInterval(timer);
  }, [reload, active]);
}

export function hasActiveRuns(runs: Run[] | undefined): boolean {
  return Boolean(runs?.some((r) => !TERMINAL_STATUSES.includes(r.status)));
}

export function RunsPage() {
  const [params, setParams] = useSearchParams();
  const status = params.get("status") ?? "";
  const program = params.get("program") ?? "";
  // Set from a run page's "Run tree" card: the runs that run spawned (symphony.spawn).
  const parent = params.get("parent") ?? "";
  const programs = useAsync(listPrograms);
  const runs = useAsync(
    () => listRuns(program ? Number(program) : undefined, status || undefined, parent || undefined),
    [program, status, parent],
  );
  // Polls whatever the filters: a run started elsewhere (CLI, API) or one that just ended
  // shows up without a reload.
  const [live, setLive] = useState(true);
  usePolling(runs.reload, live);
  const setFilter = (key: string, value: string) => {
    const next = new URLSearchParams(params);
    if (value) next.set(key, value);
    else next.delete(key);
    setParams(next, { replace: true });
  };
  return (
    <>
      <PageHeader title="Runs" actions={<button type="button" className="btn" onClick={runs.reload}>Refresh</button>}>
        Every run of this tenant, newest first. Queued and running ones update on their own.
      </PageHeader>
      <form className="filters" aria-label="Filter runs" onSubmit={(e) => e.preventDefault()}>
        <label className="field">
          Status
          <select value={status} onChange={(e) => setFilter("status", e.target.value)}>
            <option value="">any</option>
            {STATUSES.map((s) => (
              <option key={s} value={s}>
                {s.replace("_", " ")}
              </option>
            ))}
          </select>
        </label>
        <label className="field">
          Program
          <select value={program} onChange={(e) => setFilter("program", e.target.value)}>
            <option value="">any</option>
            {(programs.data ?? []).map((p) => (
              <option key={p.id} value={p.id}>
                {p.name}
              </option>
            ))}
          </select>
        </label>
        <label className="check">
          <input type="checkbox" checked={live} onChange={(e) => setLive(e.target.checked)} /> Update live
        </label>
      </form>
      {parent && (
        <p className="filters" data-testid="parent-filter">
          Runs spawned by <Link to={`/runs/${parent}`} className="mono">run {parent.slice(0, 8)}</Link>{" "}
          <button type="button" className="btn" onClick={() => setFilter("parent", "")}>
            Show every run
          </button>
        </p>
      )}
      <AsyncBlock state={runs} label="Loading runs…">
        {(list) => (
          <RunTable
            runs={list}
            empty={
              status || program || parent ? (
                "No runs match these filters."
              ) : (
                <>
                  No runs yet. Open a program on the <Link to="/programs">Programs</Link> page and press Run program, or{" "}
                  <Link to="/programs">try the example</Link>.
                </>
              )
            }
          />
        )}
      </AsyncBlock>
    </>
  );
}
