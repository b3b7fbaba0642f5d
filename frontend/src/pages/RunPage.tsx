import { useEffect, useState } from "react";
import { Link, useParams } from "react-router";
import { cancelRun, getRun, getRunLogs } from "../api/endpoints";
import { TERMINAL_STATUSES, type Run, type RunLogs } from "../api/types";
import { KVUsagePanel } from "../components/KVUsagePanel";
import { PageHeader } from "../components/PageHeader";
import { AsyncBlock, ErrorBanner } from "../components/Status";
import { StatusBadge } from "../components/StatusBadge";
import { useAsync } from "../hooks/useAsync";
import { useRunEvents } from "../hooks/useRunEvents";
import { formatDate, formatDuration } from "../lib/format";

const POLL_MS = 2000;

function Timings({ run, tokens, firstTokenMs }: { run: Run; tokens: number; firstTokenMs: number | null }) {
  const seconds = run.started_at
    ? ((run.finished_at ? new Date(run.finished_at).getTime() : Date.now()) - new Date(run.started_at).getTime()) / 1000
    : 0;
  return (
    <dl className="facts">
      <dt>Created</dt>
      <dd>{formatDate(run.created_at)}</dd>
      <dt>Queued for</dt>
      <dd>{run.started_at ? formatDuration(run.created_at, run.started_at) : "—"}</dd>
      <dt>Running time</dt>
      <dd>{run.started_at ? formatDuration(run.started_at, run.finished_at) : "—"}</dd>
      <dt>First token</dt>
      <dd>{firstTokenMs === null ? "—" : `${(firstTokenMs / 1000).toFixed(2)} s after opening the stream`}</dd>
      <dt>Streamed chunks</dt>
      <dd data-testid="token-count">{tokens}</dd>
      <dt>Chunks / s</dt>
      <dd>{seconds > 0 && tokens ? (tokens / seconds).toFixed(1) : "—"}</dd>
      <dt>Worker</dt>
      <dd>{run.worker || "—"}</dd>
      <dt>Exit code</dt>
      <dd>{run.exit_code ?? "—"}</dd>
    </dl>
  );
}

function Output({ text, messages, live }: { text: string; messages: unknown[]; live: boolean }) {
  return (
    <section className="card" aria-labelledby="output-title">
      <div className="card-head">
        <h2 id="output-title">Output</h2>
        {live && <span className="live-dot">streaming</span>}
      </div>
      <pre className="stream" data-testid="token-stream" aria-live="polite" aria-busy={live}>
        {text || (live ? "Waiting for tokens…" : "No streamed text.")}
      </pre>
      {messages.length > 0 && (
        <>
          <h3>Messages</h3>
          <ol className="messages">
            {messages.map((m, i) => (
              <li key={i}>
                <pre>{JSON.stringify(m, null, 2)}</pre>
              </li>
            ))}
          </ol>
        </>
      )}
    </section>
  );
}

/** What the program printed to stdout/stderr: kept by the server once the run has ended. */
function ProgramLogs({ runId, finished, streamEnded }: { runId: string; finished: boolean; streamEnded: boolean }) {
  const [logs, setLogs] = useState<RunLogs | null>(null);
  const [error, setError] = useState<unknown>(null);
  // Fetched when the row is terminal, and again at the stream's `end`: a run cancelled from
  // here is terminal at once, while its executor records the output a moment later.
  useEffect(() => {
    if (!finished) return;
    getRunLogs(runId).then(setLogs, setError);
  }, [runId, finished, streamEnded]);
  return (
    <section className="card" aria-labelledby="logs-title">
      <h2 id="logs-title">Program output</h2>
      <ErrorBanner error={error} />
      {!finished && <p className="muted">stdout and stderr appear here when the run has ended.</p>}
      {logs && (
        <>
          {logs.truncated && <p className="muted">Only the end of the output is kept.</p>}
          <h3>stdout</h3>
          <pre className="mono small" data-testid="run-stdout">
            {logs.stdout || "(nothing)"}
          </pre>
          <h3>stderr</h3>
          <pre className="mono small" data-testid="run-stderr">
            {logs.stderr || "(nothing)"}
          </pre>
        </>
      )}
    </section>
  );
}

function RunBody({ initial }: { initial: Run }) {
  const [run, setRun] = useState(initial);
  const [cancelError, setCancelError] = useState<unknown>(null);
  const [cancelling, setCancelling] = useState(false);
  const terminal = TERMINAL_STATUSES.includes(run.status);
  // Always subscribe: for a finished run the stream replays its events (while Redis keeps them).
  const stream = useRunEvents(run.id, true);

  // Poll the run row until it is terminal, and once more when the stream ends.
  useEffect(() => {
    if (terminal) return;
    const timer = window.setInterval(() => {
      getRun(run.id).then(setRun).catch(() => undefined);
    }, POLL_MS);
    return () => window.clearInterval(timer);
  }, [run.id, terminal]);
  useEffect(() => {
    if (stream.ended) getRun(run.id).then(setRun).catch(() => undefined);
  }, [stream.ended, run.id]);

  // The stream's `end` is as final as the row; the row catches up right after (refetch above).
  const finished = terminal || stream.ended;
  const status = terminal ? run.status : (stream.status ?? run.status);
  const error = run.error || stream.error;
  const result = run.result ?? stream.result;
  return (
    <>
      <PageHeader
        title={`Run ${run.id.slice(0, 8)}`}
        actions={
          !finished && (
            <button
              type="button"
              className="btn btn-danger"
              disabled={cancelling}
              onClick={async () => {
                setCancelling(true);
                try {
                  setRun(await cancelRun(run.id));
                } catch (err) {
                  setCancelError(err);
                } finally {
                  setCancelling(false);
                }
              }}
            >
              {cancelling ? "Cancelling…" : "Cancel run"}
            </button>
          )
        }
      >
        <Link to={`/programs/${run.program}`}>Program #{run.program}</Link> v{run.version} ·{" "}
        <span data-testid="run-status">
          <StatusBadge status={status} />
        </span>
      </PageHeader>
      <ErrorBanner error={cancelError} />
      {error && (
        <div className="banner banner-error" role="alert">
          <strong>Error:</strong> <span className="mono">{error}</span>
        </div>
      )}
      <div className="grid-2">
        <Output text={stream.text} messages={stream.messages} live={!terminal && stream.connected && !stream.ended} />
        <section className="card" aria-labelledby="timings-title">
          <h2 id="timings-title">Status and timings</h2>
          <Timings run={run} tokens={stream.tokens} firstTokenMs={stream.firstTokenAt} />
          <h3>Arguments</h3>
          <pre className="mono small">{JSON.stringify(run.args, null, 2)}</pre>
          {result !== null && result !== undefined && (
            <>
              <h3>Result</h3>
              <pre className="mono small" data-testid="run-result">
                {typeof result === "string" ? result : JSON.stringify(result, null, 2)}
              </pre>
            </>
          )}
        </section>
      </div>
      <KVUsagePanel samples={stream.kv} live={!terminal && stream.connected && !stream.ended} />
      <ProgramLogs runId={run.id} finished={terminal} streamEnded={stream.ended} />
    </>
  );
}

export function RunPage() {
  const id = useParams().id ?? "";
  const run = useAsync(() => getRun(id), [id]);
  return (
    <AsyncBlock state={run} label="Loading run…">
      {(r) => <RunBody key={r.id} initial={r} />}
    </AsyncBlock>
  );
}
