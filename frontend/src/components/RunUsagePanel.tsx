import type { Run } from "../api/types";
import { formatBytes, formatNumber, plural } from "../lib/format";

function seconds(value: number | null | undefined): string {
  return value === null || value === undefined ? "—" : `${value.toFixed(value < 10 ? 2 : 1)} s`;
}

/** What the run used and what it cost, as the server recorded it when the run ended
 *  (`usage` of `GET /runs/<id>`), and its queue wait (the first token's time is with the
 *  run's other timings, one figure: pages/RunPage.tsx firstTokenSeconds). */
export function RunUsagePanel({ run }: { run: Run }) {
  const usage = run.usage;
  const timings = run.timings;
  return (
    <section className="card" aria-labelledby="run-usage-title" data-testid="run-usage">
      <h2 id="run-usage-title">Usage and cost</h2>
      {/* One list, so the labels and figures line up in two columns. */}
      <dl className="facts">
        <dt>Queue wait</dt>
        <dd data-testid="usage-queue-wait">{seconds(timings?.queue_wait_s)}</dd>
        {usage && (
          <>
            <dt>Prefill tokens</dt>
            <dd data-testid="usage-prefill">{formatNumber(usage.prefill_tokens)}</dd>
            <dt>Cached tokens</dt>
            <dd title="prompt tokens not computed: served from the prefix cache or stored KV files the run opened">{formatNumber(usage.cached_tokens)}</dd>
            <dt>Decode tokens</dt>
            <dd data-testid="usage-decode">{formatNumber(usage.decode_tokens)}</dd>
            <dt>Streamed</dt>
            <dd data-testid="usage-streamed">
              {plural(usage.streamed_events, "event")} · {formatBytes(usage.streamed_bytes)}
            </dd>
            <dt>pred calls / forwards</dt>
            <dd>
              {formatNumber(usage.pred_calls)} / {formatNumber(usage.forwards)}
            </dd>
            <dt>KV page-seconds</dt>
            <dd>{formatNumber(usage.page_seconds)}</dd>
            <dt>Sandbox seconds</dt>
            <dd>{formatNumber(usage.sandbox_seconds)}</dd>
            <dt>Cost</dt>
            <dd data-testid="usage-cost">
              {usage.cost.total} {usage.cost.currency}
            </dd>
          </>
        )}
      </dl>
      {!usage && <p className="muted">Token counts and cost are recorded when the run has ended.</p>}
    </section>
  );
}
