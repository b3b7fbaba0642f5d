import { useState } from "react";
import { Navigate } from "react-router";
import {
  evictKVFile,
  getServiceHealth,
  listAllKVFiles,
  listPlans,
  listTenants,
  listWorkers,
  setTenantPlan,
  staffCloseTenant,
} from "../api/endpoints";
import type { AdminTenant, WorkerHealth } from "../api/types";
import { useAuth } from "../auth/AuthContext";
import { ConfirmButton } from "../components/ConfirmButton";
import { EngineTimeline } from "../components/EngineTimeline";
import { KVFileTable } from "../components/KVFileTable";
import { Meter } from "../components/Meter";
import { PageHeader } from "../components/PageHeader";
import { AsyncBlock, Empty, ErrorBanner, Notice } from "../components/Status";
import { useAsync } from "../hooks/useAsync";
import { formatDate, formatNumber } from "../lib/format";

function WorkerCard({ worker }: { worker: WorkerHealth }) {
  const total = worker.pages_total ?? 0;
  const used = total - (worker.pages_free ?? 0);
  const occupancy = Math.round((worker.metrics?.batch_occupancy ?? 0) * 100);
  return (
    <article className="card worker" aria-label={`Worker ${worker.name}`}>
      <h3>
        {worker.name} <span className={`badge badge-${worker.ok ? "ok" : "bad"}`}>{worker.ok ? "healthy" : "unhealthy"}</span>
      </h3>
      {worker.error && <p className="field-error">{worker.error}</p>}
      <Meter label="KV pages used" used={used} limit={total} />
      <Meter label="Batch occupancy (%)" used={occupancy} limit={100} />
      <dl className="facts">
        <dt>Queue depth</dt>
        <dd>{formatNumber(worker.metrics?.queued_calls ?? 0)} calls / {formatNumber(worker.metrics?.queued_tokens ?? 0)} tokens</dd>
        <dt>Sessions</dt>
        <dd>{worker.sessions ?? "—"}</dd>
        <dt>Device</dt>
        <dd>{worker.device ?? "—"}</dd>
        <dt>Forward (avg)</dt>
        <dd>{worker.metrics?.forward_ms_avg !== undefined ? `${worker.metrics.forward_ms_avg.toFixed(1)} ms` : "—"}</dd>
      </dl>
      <EngineTimeline worker={worker.name} />
    </article>
  );
}

function WorkersSection() {
  const workers = useAsync(listWorkers);
  const health = useAsync(getServiceHealth);
  return (
    <section aria-labelledby="workers-title">
      <h2 id="workers-title">Worker health</h2>
      <AsyncBlock state={health} label="Checking services…">
        {(h) => (
          <p className="muted">
            Control plane: <span className={`badge badge-${h.status === "ok" ? "ok" : "bad"}`}>{h.status}</span>{" "}
            {Object.entries(h.checks).map(([k, v]) => `${k}: ${v}`).join(" · ")}
          </p>
        )}
      </AsyncBlock>
      <AsyncBlock state={workers} label="Loading workers…">
        {(list) =>
          list === null ? (
            <Notice tone="warn">This control plane does not serve worker health yet (GET /api/v1/admin/workers).</Notice>
          ) : list.length ? (
            <div className="grid-3">{list.map((w) => <WorkerCard key={w.name} worker={w} />)}</div>
          ) : (
            <Empty>No workers registered.</Empty>
          )
        }
      </AsyncBlock>
    </section>
  );
}

/** Change plan: a select and Save, inline in the row. */
function PlanCell({ tenant, plans, onChanged }: { tenant: AdminTenant; plans: string[]; onChanged: (msg: string) => void }) {
  const [plan, setPlan] = useState(tenant.plan);
  const [error, setError] = useState<unknown>(null);
  const [busy, setBusy] = useState(false);
  if (tenant.closed_at) return <>{tenant.plan}</>;
  const options = plans.includes(tenant.plan) ? plans : [tenant.plan, ...plans];
  return (
    <form
      className="inline-form"
      onSubmit={async (e) => {
        e.preventDefault();
        setBusy(true);
        try {
          await setTenantPlan(tenant.id, plan);
          setError(null);
          onChanged(`${tenant.slug} is on the ${plan} plan now.`);
        } catch (err) {
          setError(err);
        } finally {
          setBusy(false);
        }
      }}
    >
      <label className="visually-hidden" htmlFor={`plan-${tenant.id}`}>
        Plan of {tenant.slug}
      </label>
      <select id={`plan-${tenant.id}`} value={plan} onChange={(e) => setPlan(e.target.value)}>
        {options.map((p) => (
          <option key={p} value={p}>
            {p}
          </option>
        ))}
      </select>
      <button type="submit" className="btn btn-small" disabled={busy || plan === tenant.plan}>
        {busy ? "Saving…" : "Change plan"}
      </button>
      <ErrorBanner error={error} />
    </form>
  );
}

function TenantTable({ tenants, plans, onChanged }: { tenants: AdminTenant[]; plans: string[]; onChanged: (msg: string) => void }) {
  const [error, setError] = useState<unknown>(null);
  if (!tenants.length) return <Empty>No tenants yet. One is made for every sign-up.</Empty>;
  return (
    <>
      <ErrorBanner error={error} />
      <div className="table-wrap">
        <table className="stack-narrow">
          <caption className="visually-hidden">Tenants</caption>
          <thead>
            <tr>
              <th scope="col">Tenant</th>
              <th scope="col">Plan</th>
              <th scope="col" className="num">Members</th>
              <th scope="col" className="num">Programs</th>
              <th scope="col" className="num">Active runs</th>
              <th scope="col">Actions</th>
            </tr>
          </thead>
          <tbody>
            {tenants.map((t) => (
              <tr key={t.id}>
                <td data-label="Tenant">
                  {t.name} <span className="muted mono">{t.slug}</span>{" "}
                  {t.closed_at && (
                    <span className="badge badge-bad" title={`closed ${formatDate(t.closed_at)}`}>
                      {t.purged_at ? "closed, data deleted" : "closed, deleting data"}
                    </span>
                  )}
                </td>
                <td data-label="Plan">
                  <PlanCell tenant={t} plans={plans} onChanged={onChanged} />
                </td>
                <td data-label="Members" className="num">{t.members}</td>
                <td data-label="Programs" className="num">{t.programs}</td>
                <td data-label="Active runs" className="num">{t.active_runs}</td>
                <td data-label="Actions" className="actions">
                  {/* Everything about one tenant (members, keys, limits) is in Django's admin. */}
                  <a className="btn btn-small" href={`/admin/api/tenant/${t.id}/change/`} aria-label={`Open ${t.slug} in the Django admin`}>
                    Open
                  </a>{" "}
                  {!t.closed_at && (
                    <ConfirmButton
                      ariaLabel={`Close ${t.slug}`}
                      confirmLabel={`Close ${t.slug} and delete its data`}
                      onConfirm={async () => {
                        try {
                          await staffCloseTenant(t.id, t.slug);
                          setError(null);
                          onChanged(`Closed ${t.slug}: its runs were cancelled and its data is being deleted.`);
                        } catch (err) {
                          setError(err);
                        }
                      }}
                    >
                      Close
                    </ConfirmButton>
                  )}
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      </div>
    </>
  );
}

export function AdminPage() {
  const { isStaff } = useAuth();
  const files = useAsync(() => (isStaff ? listAllKVFiles() : Promise.resolve([])), [isStaff]);
  const tenants = useAsync(() => (isStaff ? listTenants() : Promise.resolve([])), [isStaff]);
  const plans = useAsync(() => (isStaff ? listPlans() : Promise.resolve([])), [isStaff]);
  const [changed, setChanged] = useState<string | null>(null);
  const [error, setError] = useState<unknown>(null);
  const [evicted, setEvicted] = useState<string | null>(null);
  if (!isStaff) return <Navigate to="/programs" replace />;
  return (
    <>
      <PageHeader title="Staff">
        Operator view across all tenants. Users, plans and audit rows in full are in the <a href="/admin/">Django admin</a>.
      </PageHeader>
      <WorkersSection />
      <section aria-labelledby="tenants-title">
        <h2 id="tenants-title">Tenants</h2>
        {changed && <Notice tone="ok">{changed}</Notice>}
        <AsyncBlock state={tenants} label="Loading tenants…">
          {(list) => (
            <TenantTable
              tenants={list}
              plans={plans.data ?? []}
              onChanged={(msg) => {
                setChanged(msg);
                tenants.reload();
              }}
            />
          )}
        </AsyncBlock>
      </section>
      <section aria-labelledby="allkv-title">
        <h2 id="allkv-title">All KV files</h2>
        <ErrorBanner error={error} />
        {evicted && <Notice tone="ok">Evicted {evicted} from device and host memory (it stays on disk until deleted).</Notice>}
        <AsyncBlock state={files} label="Loading KV files…">
          {(list) => (
            <KVFileTable
              caption="All tenants' KV files"
              files={list}
              showTenant
              actions={(f) => (
                <ConfirmButton
                  ariaLabel={`Evict ${f.tenant}/${f.name}`}
                  confirmLabel="Evict now"
                  onConfirm={async () => {
                    try {
                      await evictKVFile(f.id);
                      setError(null);
                      setEvicted(`${f.tenant}/${f.name}`);
                      files.reload();
                    } catch (err) {
                      setEvicted(null);
                      setError(err);
                    }
                  }}
                >
                  Evict
                </ConfirmButton>
              )}
            />
          )}
        </AsyncBlock>
      </section>
    </>
  );
}
