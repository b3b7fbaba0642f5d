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
          <p className="muted" data-testid="kv-latest">
            {last.tokens} tokens in this run's open KV files · {samples.length} samples
          </p>
        </>
      )}
    </section>
  );
}
