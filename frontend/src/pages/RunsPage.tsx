import { Link } from "react-router";
import { listRuns } from "../api/endpoints";
import type { Run } from "../api/types";
import { PageHeader } from "../components/PageHeader";
import { AsyncBlock, Empty } from "../components/Status";
import { StatusBadge } from "../components/StatusBadge";
import { useAsync } from "../hooks/useAsync";
import { formatDate, formatDuration } from "../lib/format";

export function RunTable({ runs }: { runs: Run[] }) {
  if (!runs.length) return <Empty>No runs yet.</Empty>;
  return (
    <div className="table-wrap">
      <table>
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
              </td>
              <td>
                <Link to={`/programs/${r.program}`}>#{r.program}</Link> v{r.version}
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

export function RunsPage() {
  const runs = useAsync(() => listRuns());
  return (
    <>
      <PageHeader title="Runs" actions={<button type="button" className="btn" onClick={runs.reload}>Refresh</button>}>
        Every run of this tenant, newest first.
      </PageHeader>
      <AsyncBlock state={runs} label="Loading runs…">
        {(list) => <RunTable runs={list} />}
      </AsyncBlock>
    </>
  );
}
