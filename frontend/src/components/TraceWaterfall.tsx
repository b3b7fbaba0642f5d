import { useEffect, useMemo, useRef, useState, type KeyboardEvent } from "react";
import { getRunTrace, runTraceChromeUrl } from "../api/endpoints";
import type { RunTrace, RunTraceSpan } from "../api/types";
import { formatSeconds, fullWindow, layoutRows, slowestOperations, ticks, zoomWindow, SLOWEST_COUNT } from "../lib/waterfall";
import { Empty, ErrorBanner, Loading } from "./Status";

/** The executor records the trace as the run ends, a moment after its row turns terminal (a
 * cancel): ask again for a few seconds before saying it has none. */
const RETRY_MS = 1000;
const RETRIES = 8;
/** Depth past which rows are no longer indented further (keeps labels readable on a phone). */
const MAX_INDENT = 6;

function spanLabel(span: RunTraceSpan): string {
  const count = typeof span.attrs.count === "number" ? ` ×${span.attrs.count}` : "";
  return `${span.name}${count}`;
}

function describe(span: RunTraceSpan, slowRank: number | null): string {
  const slow = slowRank ? `, slowest operation number ${slowRank}` : "";
  return `${spanLabel(span)}, ${formatSeconds(span.duration_s)}, from ${formatSeconds(span.start_s)} to ${formatSeconds(span.end_s)}${slow}`;
}

/** The run's trace fetched once the run has ended (retried while the executor records it). */
function useRunTrace(runId: string, finished: boolean) {
  const [trace, setTrace] = useState<RunTrace | null>(null);
  const [error, setError] = useState<unknown>(null);
  const [settled, setSettled] = useState(false);
  useEffect(() => {
    if (!finished) return;
    let live = true;
    let timer = 0;
    const fetchTrace = (triesLeft: number) => {
      getRunTrace(runId).then(
        (got) => {
          if (!live) return;
          setTrace(got);
          setError(null);
          if (!got.complete && triesLeft > 0) timer = window.setTimeout(() => fetchTrace(triesLeft - 1), RETRY_MS);
          else setSettled(true);
        },
        (err) => {
          if (!live) return;
          setError(err);
          setSettled(true);
        },
      );
    };
    fetchTrace(RETRIES);
    return () => {
      live = false;
      window.clearTimeout(timer);
    };
  }, [runId, finished]);
  return { trace, error, settled };
}

/** The spans as a waterfall: bars on a time axis, children indented under their parent, the
 * slowest operations highlighted; a row zooms the axis to its span (Escape or the button
 * resets), arrow keys move between rows. */
export function Waterfall({ spans }: { spans: RunTraceSpan[] }) {
  const [zoomed, setZoomed] = useState<RunTraceSpan | null>(null);
  const whole = useMemo(() => fullWindow(spans), [spans]);
  const view = zoomed ? zoomWindow(zoomed) : whole;
  const rows = layoutRows(spans, view);
  const slowest = useMemo(() => slowestOperations(spans).map((id) => spans.find((s) => s.id === id)!), [spans]);
  const listRef = useRef<HTMLOListElement>(null);

  const onKeyDown = (event: KeyboardEvent<HTMLOListElement>) => {
    const buttons = Array.from(listRef.current?.querySelectorAll<HTMLButtonElement>("button.wf-span") ?? []);
    const at = buttons.indexOf(document.activeElement as HTMLButtonElement);
    const go = (i: number) => buttons[Math.max(0, Math.min(buttons.length - 1, i))]?.focus();
    if (event.key === "ArrowDown") go(at + 1);
    else if (event.key === "ArrowUp") go(at - 1);
    else if (event.key === "Home") go(0);
    else if (event.key === "End") go(buttons.length - 1);
    else if (event.key === "Escape" && zoomed) setZoomed(null);
    else return;
    event.preventDefault();
  };

  return (
    <>
      <div className="wf-toolbar">
        <p className="muted small" data-testid="trace-window" aria-live="polite">
          {zoomed
            ? `Zoomed to ${spanLabel(zoomed)}: ${formatSeconds(view.start)} to ${formatSeconds(view.end)}`
            : `Whole run: ${formatSeconds(whole.end - whole.start)}`}
          {" · "}Select a span to zoom to it.
        </p>
        {zoomed && (
          <button type="button" className="btn btn-small" onClick={() => setZoomed(null)} data-testid="trace-reset">
            Show the whole run
          </button>
        )}
      </div>
      {slowest.length > 0 && (
        <p className="small" data-testid="trace-slowest">
          <span className="wf-swatch" aria-hidden="true" /> Slowest {slowest.length < SLOWEST_COUNT ? "" : `${SLOWEST_COUNT} `}
          operations:{" "}
          {slowest.map((s, i) => (
            <span key={s.id}>
              {i > 0 && ", "}
              <strong>{spanLabel(s)}</strong> {formatSeconds(s.duration_s)}
            </span>
          ))}
        </p>
      )}
      <div className="wf-axis" aria-hidden="true">
        <span className="wf-axis-label">seconds since the run was created</span>
        <span className="wf-axis-track">
          {ticks(view).map(({ t, at }) => (
            <span key={t} className="wf-tick" style={{ left: `${at}%` }}>
              {formatSeconds(t)}
            </span>
          ))}
        </span>
      </div>
      <ol className="waterfall" ref={listRef} onKeyDown={onKeyDown} aria-label="Spans of the run, in tree order" data-testid="trace-rows">
        {rows.map(({ span, depth, left, width, slowRank }) => (
          <li key={span.id} className={slowRank ? "wf-row wf-slow" : "wf-row"} data-span={span.name} data-kind={span.kind} data-slow-rank={slowRank ?? undefined}>
            <button
              type="button"
              className="wf-span"
              aria-label={describe(span, slowRank)}
              aria-current={zoomed?.id === span.id ? "true" : undefined}
              onClick={() => setZoomed(span)}
            >
              <span className="wf-label" style={{ paddingLeft: `${Math.min(depth, MAX_INDENT) * 0.75}rem` }}>
                <span className="wf-name">{spanLabel(span)}</span>{" "}
                <span className="wf-duration">{formatSeconds(span.duration_s)}</span>
                {slowRank && <span className="wf-rank">#{slowRank}</span>}
              </span>
              <span className="wf-track">
                <span className={`wf-bar wf-kind-${span.kind}`} data-testid="trace-bar" style={{ left: `${left}%`, width: `${width}%` }} />
              </span>
            </button>
          </li>
        ))}
      </ol>
    </>
  );
}

/** The run page's trace card: the waterfall once the run has ended, a download of the Chrome
 * format for Perfetto, and what to expect while there is none. */
export function TraceWaterfall({ runId, finished }: { runId: string; finished: boolean }) {
  const { trace, error, settled } = useRunTrace(runId, finished);
  let body;
  if (!finished) body = <Empty>The trace appears here when the run has ended: its executor records the spans at its end.</Empty>;
  else if (error) body = <ErrorBanner error={error} />;
  else if (!trace || (!trace.complete && !settled)) body = <Loading label="Loading the trace…" />;
  else if (!trace.complete) body = <Empty>No trace was recorded for this run.</Empty>;
  else body = <Waterfall spans={trace.spans} />;
  return (
    <section className="card" aria-labelledby="trace-title" data-testid="trace">
      <div className="card-head">
        <h2 id="trace-title">Trace</h2>
        {finished && trace?.complete && (
          <a className="btn btn-small" href={runTraceChromeUrl(runId)} download={`run-${runId}-trace.json`} data-testid="trace-download">
            Download trace (Chrome format)
          </a>
        )}
      </div>
      {body}
      {trace?.complete && trace.worker_tracing === "off" && (
        <p className="muted small" data-testid="trace-off">
          Tracing was off on this run's worker: no per-call spans, only the control plane's marks.
        </p>
      )}
      {trace?.complete && (trace.dropped > 0 || trace.children_left_out > 0) && (
        <p className="muted small">
          {trace.dropped > 0 && `${trace.dropped} worker spans past the bound were only counted. `}
          {trace.children_left_out > 0 && `${trace.children_left_out} spawned runs are not listed.`}
        </p>
      )}
      {trace?.complete && <p className="muted small">Open the download in Perfetto (ui.perfetto.dev) or chrome://tracing.</p>}
    </section>
  );
}
