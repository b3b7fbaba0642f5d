import type { KVSample } from "../lib/runEvents";
import { LineChart } from "./LineChart";
import { Empty } from "./Status";

export const KV_COLORS = { device: "#2563eb", host: "#d97706", disk: "#7c3aed", tenant: "#059669" };

/** Live KV pages of the worker (device/host/disk) and of this tenant, from `kv` events. */
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
              { key: "device", label: "Device pages", color: KV_COLORS.device, values: samples.map((s) => s.device_pages) },
              { key: "host", label: "Host pages", color: KV_COLORS.host, values: samples.map((s) => s.host_pages) },
              { key: "disk", label: "Disk pages", color: KV_COLORS.disk, values: samples.map((s) => s.disk_pages) },
              { key: "tenant", label: "This tenant on device", color: KV_COLORS.tenant, values: samples.map((s) => s.tenant_device_pages) },
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
