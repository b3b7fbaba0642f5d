import { useEffect, useState } from "react";
import { Link, useParams } from "react-router";
import { cancelRun, getRun, getRunLogs } from "../api/endpoints";
import { TERMINAL_STATUSES, type Run, type RunLogs } from "../api/types";
import { useAuth } from "../auth/AuthContext";
import { ConfirmButton } from "../components/ConfirmButton";
import { CopyButton } from "../components/CopyButton";
import { KVUsagePanel } from "../components/KVUsagePanel";
import { RunUsagePanel } from "../components/RunUsagePanel";
import { TraceWaterfall } from "../components/TraceWaterfall";
import { PageHeader } from "../components/PageHeader";
import { AsyncBlock, ErrorBanner, Notice } from "../components/Status";
import { StatusBadge } from "../components/StatusBadge";
import { useAsync } from "../hooks/useAsync";
import { useRunEvents } from "../hooks/useRunEvents";
import { formatDate, formatDuration } from "../lib/format";
import type { ChannelSent } from "../lib/runEvents";

const POLL_MS = 2000;
const LOGS_RETRY_MS = 1000;
const LOGS_RETRIES = 8;

/** Seconds from the run's creation to its first streamed token: the server's figure once the
 * run has ended (`timings.time_to_first_token_s`), until then the live stream's, both by the
 * server's clocks (the run row's created_at, the event's stream id), so the page shows one
 * figure that reads the same live and after a reload. */
export function firstTokenSeconds(run: Run, firstTokenAt: number | null): number | null {
  const recorded = run.timings?.time_to_first_token_s;
  if (recorded !== null && recorded !== undefined) return recorded;
  if (firstTokenAt === null) return null;
  return Math.max(0, firstTokenAt - Date.parse(run.created_at)) / 1000;
}

function Timings({ run, tokens, firstTokenAt }: { run: Run; tokens: number; firstTokenAt: number | null }) {
  const firstToken = firstTokenSeconds(run, firstTokenAt);
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
      <dd data-testid="first-token">{firstToken === null ? "—" : `${firstToken.toFixed(2)} s after the run was created`}</dd>
      <dt>Streamed chunks</dt>
      <dd data-testid="token-count">{tokens}</dd>
      <dt>Chunks / s</dt>
      <dd>{seconds > 0 && tokens ? (tokens / seconds).toFixed(1) : "—"}</dd>
      <dt>Worker</dt>
      <dd>{run.worker || "—"}</dd>
      <dt>Exit code</dt>
      <dd data-testid="exit-code">{run.exit_code ?? "—"}</dd>
    </dl>
  );
}

/** Where the run sits in its run tree (symphony.spawn): the run that spawned it and the runs
 * it spawned, as links; nothing for a run with neither. */
export function RunTree({ run }: { run: Run }) {
  const children = run.children ?? [];
  if (!run.parent && children.length === 0) return null;
  return (
    <section className="card" aria-labelledby="tree-title" data-testid="run-tree">
      <h2 id="tree-title">Run tree</h2>
      {run.parent && (
        <p>
          Spawned by <Link to={`/runs/${run.parent}`}>run {run.parent.slice(0, 8)}</Link>
          {run.entry ? ` · entry ${run.entry}` : ""}
        </p>
      )}
      {children.length > 0 && (
        <>
          <h3>
            Spawned runs ({children.length}) <Link to={`/runs?parent=${run.id}`}>in the runs list</Link>
          </h3>
          <ul data-testid="run-children">
            {children.map((c) => (
              <li key={c.id}>
                <Link to={`/runs/${c.id}`}>{c.id.slice(0, 8)}</Link> <StatusBadge status={c.status} />{" "}
                <span className="mono small">{c.entry || "main"}</span>
              </li>
            ))}
          </ul>
        </>
      )}
    </section>
  );
}

function Output({
  text,
  messages,
  channel,
  live,
}: {
  text: string;
  messages: unknown[];
  channel: ChannelSent[];
  live: boolean;
}) {
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
      {channel.length > 0 && (
        <>
          <h3>Sent on channels</h3>
          <ol className="messages" data-testid="channel-messages">
            {channel.map((m, i) => (
              <li key={i}>
                <span className="mono small">
                  {m.op === "publish" ? "published on" : "sent on"} {m.channel} · {m.bytes} B
                </span>
                <pre>{JSON.stringify(m.data, null, 2)}</pre>
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
  // The output is recorded with the outcome, a moment after a cancel: while both streams are
  // empty, ask again for a few seconds rather than show "(nothing)" until a reload.
  useEffect(() => {
    if (!finished) return;
    let live = true;
    let timer = 0;
    const fetchLogs = (triesLeft: number) => {
      getRunLogs(runId).then(
        (got) => {
          if (!live) return;
          setLogs(got);
          setError(null);
          if (!got.stdout && !got.stderr && triesLeft > 0) timer = window.setTimeout(() => fetchLogs(triesLeft - 1), LOGS_RETRY_MS);
        },
        (err) => live && setError(err),
      );
    };
    fetchLogs(LOGS_RETRIES);
    return () => {
      live = false;
      window.clearTimeout(timer);
    };
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

/** The line that names the error: the server writes the exception first ("ValueError: …")
 * with the program's frames after it; a Python-style traceback ends with it instead. */
export function errorSummary(error: string): string {
  const lines = error.trim().split("\n");
  if (lines[0].startsWith("Traceback (most recent call last)")) return lines[lines.length - 1].trim();
  return lines[0];
}

/** A failed run's error: the exception as the summary, the whole (with the program's frames)
 * kept as printed, with a copy button. */
function RunError({ error }: { error: string }) {
  const lines = error.trimEnd().split("\n");
  return (
    <div className="banner banner-error banner-stack" role="alert" data-testid="run-error">
      <div className="card-head">
        <strong data-testid="run-error-summary">{errorSummary(error)}</strong>
        <CopyButton text={error} label="Copy error" />
      </div>
      {lines.length > 1 && (
        <pre className="traceback mono small" data-testid="run-traceback" tabIndex={0}>
          {error}
        </pre>
      )}
    </div>
  );
}

/** A cancelled run says who stopped it and when; what the stopped program was doing at that
 * moment (its connection to the worker broke off) is not an error of the run. */
function Cancelled({ run }: { run: Run }) {
  const { me } = useAuth();
  const by = run.cancelled_by;
  const who = by && by === me?.user?.email ? " by you" : by ? ` by ${by}` : run.parent ? " with the run that spawned it" : "";
  return (
    <Notice>
      <span data-testid="run-cancelled">
        Cancelled{who} at {formatDate(run.finished_at)}
      </span>
    </Notice>
  );
}

function RunBody({ initial }: { initial: Run }) {
  const [run, setRun] = useState(initial);
  const [cancelError, setCancelError] = useState<unknown>(null);
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
  // A run cancelled from here is terminal at once, while its executor records the exit code
  // and usage a moment later: ask again for a few seconds, as for the program's output.
  const outcomePending = terminal && (run.exit_code === null || run.usage === null);
  useEffect(() => {
    if (!outcomePending) return;
    let triesLeft = LOGS_RETRIES;
    const timer = window.setInterval(() => {
      if (triesLeft-- <= 0) return window.clearInterval(timer);
      getRun(run.id).then(setRun).catch(() => undefined);
    }, LOGS_RETRY_MS);
    return () => window.clearInterval(timer);
  }, [outcomePending, run.id]);

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
            <ConfirmButton
              className="btn btn-danger"
              confirmLabel="Cancel now"
              keepLabel="Keep running"
              onConfirm={async () => {
                try {
                  setRun(await cancelRun(run.id));
                } catch (err) {
                  setCancelError(err);
                }
              }}
            >
              Cancel run
            </ConfirmButton>
          )
        }
      >
        {run.name && (
          <>
            <strong data-testid="run-title-name">{run.name}</strong> ·{" "}
          </>
        )}
        <Link to={`/programs/${run.program}`}>{run.program_name ?? `Program #${run.program}`}</Link> v{run.version} ·{" "}
        <span data-testid="run-status">
          <StatusBadge status={status} />
        </span>
      </PageHeader>
      <ErrorBanner error={cancelError} />
      {status === "cancelled" ? <Cancelled run={run} /> : error && <RunError error={error} />}
      <div className="grid-2">
        <Output
          text={stream.text}
          messages={stream.messages}
          channel={stream.channel}
          live={!terminal && stream.connected && !stream.ended}
        />
        <section className="card" aria-labelledby="timings-title">
          <h2 id="timings-title">Status and timings</h2>
          <Timings run={run} tokens={stream.tokens} firstTokenAt={stream.firstTokenAt} />
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
      <RunTree run={run} />
      <RunUsagePanel run={run} />
      <TraceWaterfall runId={run.id} finished={terminal} />
      <KVUsagePanel
        samples={stream.kv}
        origin={run.started_at ? Date.parse(run.started_at) : (stream.kv[0]?.t ?? 0)}
        live={!terminal && stream.connected && !stream.ended}
      />
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
