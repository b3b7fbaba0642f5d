import { formatNumber, plural } from "../lib/format";
import type { KVSample } from "../lib/runEvents";
import { LineChart } from "./LineChart";
import { Empty } from "./Status";

export const KV_COLORS = { run: "#2563eb", tenant: "#059669", host: "#d97706" };

/** Live KV pages of this run and of its tenant (device/host), from `kv` events; the worker's
 * totals are other tenants' business and never reach a run's stream. */
export function KVUsagePanel({ samples, origin, live }: { samples: KVSample[]; origin: number; live: boolean }) {
  const last = samples[samples.length - 1];
  return (
    <section className="card" aria-labelledby="kv-title">
      <div className="card-head">
        <h2 id="kv-title">KV usage</h2>
        {live && <span className="live-dot">live</span>}
      </div>
      {samples.length === 0 ? (
        <Empty>No KV events yet. The worker reports KV pages every few hundred milliseconds while the run holds KV files.</Empty>
      ) : (
        <>
          <LineChart
            title="KV pages over time"
            xs={samples.map((s) => Math.max(0, s.t - origin) / 1000)}
            xLabel="seconds since the run started"
            xFormat={(x) => `${x.toFixed(x < 10 ? 1 : 0)} s`}
            series={[
              { key: "run", label: "This run's pages", color: KV_COLORS.run, values: samples.map((s) => s.run_pages) },
              { key: "tenant", label: "This tenant on device", color: KV_COLORS.tenant, values: samples.map((s) => s.tenant_device_pages) },
              { key: "host", label: "This tenant in host memory", color: KV_COLORS.host, values: samples.map((s) => s.tenant_host_pages) },
            ]}
          />
          <dl className="facts" data-testid="kv-latest">
            <dt>This run's device pages</dt>
            <dd data-testid="kv-run-pages" title="what the run's KV page-seconds bill">
              {formatNumber(last.run_pages)}
            </dd>
            <dt>This tenant's device pages</dt>
            <dd data-testid="kv-tenant-device">{formatNumber(last.tenant_device_pages)}</dd>
            <dt>This tenant's host-memory pages</dt>
            <dd data-testid="kv-tenant-host">{formatNumber(last.tenant_host_pages)}</dd>
            <dt>Tokens in this run's files</dt>
            <dd>{formatNumber(last.tokens)}</dd>
          </dl>
          <p className="muted">
            {plural(samples.length, "sample")}; other tenants' pages on the worker are not shown.
          </p>
        </>
      )}
    </section>
  );
}
