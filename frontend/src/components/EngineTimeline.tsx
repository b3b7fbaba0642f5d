import { useState } from "react";
import { engineTimelineUrl, getEngineTimeline } from "../api/endpoints";
import type { EngineTimeline as Timeline } from "../api/types";
import { describeForward, layoutForwards, longestForwards, summarize } from "../lib/engineTimeline";
import { formatNumber } from "../lib/format";
import { Empty, ErrorBanner, Loading } from "./Status";

function percent(x: number): string {
  return `${Math.round(x * 100)}%`;
}

function ms(s: number): string {
  return `${(s * 1000).toFixed(1)} ms`;
}

/** The kept forwards as bars on one strip (height: batch size; colour: prefill or decode), a
 * summary of where the engine's time went, and the longest forwards. */
export function TimelineView({ timeline }: { timeline: Timeline }) {
  const { forwards } = timeline;
  const summary = summarize(forwards);
  if (!summary) return <Empty>This worker has run no forward since it started.</Empty>;
  const bars = layoutForwards(forwards);
  const first = forwards[0].start;
  const longest = longestForwards(forwards);
  return (
    <div data-testid="engine-timeline">
      <dl className="facts" data-testid="engine-timeline-summary">
        <dt>Forwards shown</dt>
        <dd>
          {formatNumber(forwards.length)} of {formatNumber(timeline.recorded)} (keeps {formatNumber(timeline.capacity)})
        </dd>
        <dt>Span</dt>
        <dd>{summary.spanS.toFixed(2)} s</dd>
        <dt>Engine busy</dt>
        <dd data-testid="engine-busy">{percent(summary.busy)}</dd>
        <dt>Forward</dt>
        <dd>
          {ms(summary.meanForwardS)} on average, batch {summary.meanBatch.toFixed(1)} (largest {summary.maxBatch})
        </dd>
        <dt>Tokens</dt>
        <dd>
          {formatNumber(summary.promptTokens)} prompt, {formatNumber(summary.decodeTokens)} decode
        </dd>
        <dt>Longest idle gap</dt>
        <dd>{ms(summary.longestIdleS)}</dd>
        <dt>Accounts in one forward</dt>
        <dd>at most {summary.maxAccounts}</dd>
      </dl>
      <p className="muted small">
        <span className="et-swatch et-prefill" aria-hidden="true" /> mostly prompt{" "}
        <span className="et-swatch et-decode" aria-hidden="true" /> mostly decode · height: batch size · gaps: the engine
        waited
      </p>
      <div className="et-strip" role="list" aria-label={`Forwards of worker ${timeline.worker}, oldest first`} data-testid="engine-strip">
        {bars.map((bar) => {
          const label = describeForward(bar.forward, bar.forward.start - first);
          return (
            <span
              key={bar.index}
              role="listitem"
              className={`et-bar et-${bar.kind}`}
              data-testid="engine-bar"
              aria-label={label}
              title={label}
              style={{ left: `${bar.left}%`, width: `${bar.width}%`, height: `${bar.height}%` }}
            />
          );
        })}
      </div>
      <p className="small" data-testid="engine-longest">
        Longest forwards:{" "}
        {longest.map((i, n) => (
          <span key={i}>
            {n > 0 && "; "}
            {describeForward(forwards[i], forwards[i].start - first)}
          </span>
        ))}
      </p>
    </div>
  );
}

/** A worker card's engine timeline: read on request (it asks the worker), downloadable for
 * Perfetto. Forwards are counted per account, never named: staff see load, not prompts. */
export function EngineTimeline({ worker }: { worker: string }) {
  const [timeline, setTimeline] = useState<Timeline | null>(null);
  const [error, setError] = useState<unknown>(null);
  const [busy, setBusy] = useState(false);
  const load = async () => {
    setBusy(true);
    try {
      setTimeline(await getEngineTimeline(worker));
      setError(null);
    } catch (err) {
      setError(err);
    } finally {
      setBusy(false);
    }
  };
  return (
    <div className="engine-timeline">
      <p className="muted">
        Engine timeline (last forwards):{" "}
        <button type="button" className="btn btn-small" onClick={load} disabled={busy} data-testid="engine-timeline-show">
          {timeline ? "Refresh" : "Show"}
        </button>{" "}
        <a href={engineTimelineUrl(worker, "json")}>JSON</a> ·{" "}
        <a href={engineTimelineUrl(worker, "chrome")} download={`${worker}-timeline.json`}>
          Chrome trace for Perfetto
        </a>
      </p>
      {busy && !timeline && <Loading label="Asking the worker…" />}
      {error !== null && <ErrorBanner error={error} />}
      {timeline && <TimelineView timeline={timeline} />}
    </div>
  );
}
