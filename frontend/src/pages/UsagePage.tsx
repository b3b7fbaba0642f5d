import { useState } from "react";
import { getQuota, getUsage, getUsageGroups, listInvoices } from "../api/endpoints";
import type { Invoice, Quota, UsageDay, UsageGroup, UsageGrouping } from "../api/types";
import { BarChart } from "../components/BarChart";
import { Meter } from "../components/Meter";
import { PageHeader } from "../components/PageHeader";
import { AsyncBlock, Empty } from "../components/Status";
import { useAsync } from "../hooks/useAsync";
import { formatBytes, formatNumber, formatUnitPrice, isoDay, plural, sumAmounts } from "../lib/format";

/** Every day in [from, to], with zeros where the API returned no row. */
export function fillDays(days: UsageDay[], from: string, to: string): UsageDay[] {
  const byDay = new Map(days.map((d) => [d.day.slice(0, 10), d]));
  const out: UsageDay[] = [];
  for (let d = new Date(`${from}T00:00:00Z`); isoDay(d) <= to; d.setUTCDate(d.getUTCDate() + 1)) {
    const key = isoDay(d);
    out.push(byDay.get(key) ?? { day: key, runs: 0, prefill_tokens: 0, decode_tokens: 0, pred_calls: 0, page_seconds: 0, io_calls: 0, cost: "0" });
  }
  return out;
}

const RANGES = [7, 30, 90];

function UsageChart({ days }: { days: UsageDay[] }) {
  const total = days.reduce((s, d) => s + d.prefill_tokens + d.decode_tokens, 0);
  const runs = days.reduce((s, d) => s + d.runs, 0);
  return (
    <>
      <BarChart
        title="Tokens per day"
        labels={days.map((d) => d.day)}
        series={[
          { key: "prefill", label: "Prefill tokens", color: "#2563eb", values: days.map((d) => d.prefill_tokens) },
          { key: "decode", label: "Decode tokens", color: "#059669", values: days.map((d) => d.decode_tokens) },
        ]}
      />
      <p className="muted" data-testid="usage-totals">
        {formatNumber(total)} tokens · {plural(runs, "run")} ·{" "}
        {formatNumber(days.reduce((s, d) => s + d.page_seconds, 0))} KV page-seconds · {sumAmounts(days.map((d) => d.cost ?? "0"))} USD in
        this range
      </p>
    </>
  );
}

const GROUPINGS: { value: UsageGrouping; label: string }[] = [
  { value: "program", label: "By program" },
  { value: "api_key", label: "By API key" },
];

/** What a breakdown row is called: its program or key, or what the usage was without one. */
export function groupLabel(g: UsageGroup): string {
  if (g.kind === "console") return "Console (no API key)";
  if (g.kind === "storage") return "Stored KV files";
  if (g.kind === "deleted") return "Deleted programs' runs";
  if (g.kind === "api_key") return `${g.name ?? "key"} (sk_${g.prefix ?? "?"}_…)`;
  return g.name ?? `program ${g.id}`;
}

function UsageBreakdown({ groups, grouping }: { groups: UsageGroup[]; grouping: UsageGrouping }) {
  if (!groups.length) return <Empty>No usage in this range.</Empty>;
  const label = GROUPINGS.find((g) => g.value === grouping)?.label ?? "";
  return (
    <div className="table-wrap">
      <table>
        <caption className="visually-hidden">Usage {label.replace(/^By/, "by")}</caption>
        <thead>
          <tr>
            <th scope="col">{grouping === "program" ? "Program" : "API key"}</th>
            <th scope="col" className="num">Runs</th>
            <th scope="col" className="num">Prefill tokens</th>
            <th scope="col" className="num" title="prompt tokens served from the prefix cache or stored KV files">Cached tokens</th>
            <th scope="col" className="num">Decode tokens</th>
            <th scope="col" className="num">Sandbox seconds</th>
            <th scope="col" className="num">Cost (USD)</th>
          </tr>
        </thead>
        <tbody>
          {groups.map((g) => (
            <tr key={`${g.kind}-${g.id ?? ""}`}>
              <td data-label="">{groupLabel(g)}</td>
              <td className="num" data-label="Runs">{formatNumber(g.runs)}</td>
              <td className="num" data-label="Prefill tokens">{formatNumber(g.prefill_tokens ?? 0)}</td>
              <td className="num" data-label="Cached tokens">{formatNumber(g.cached_tokens ?? 0)}</td>
              <td className="num" data-label="Decode tokens">{formatNumber(g.decode_tokens ?? 0)}</td>
              <td className="num" data-label="Sandbox seconds">{formatNumber(Math.round(g.sandbox_seconds ?? 0))}</td>
              <td className="num mono" data-label="Cost (USD)" data-testid="group-cost">
                {g.cost ?? "—"}
              </td>
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}

function QuotaMeters({ quota, tokensToday }: { quota: Quota; tokensToday: number }) {
  const { limits, use } = quota;
  const deadline = limits.max_run_seconds ?? limits.max_deadline_s;
  return (
    <section className="card" aria-labelledby="quota-title">
      <h2 id="quota-title">
        Quotas <span className="badge badge-neutral">plan: {quota.plan}</span>
      </h2>
      <Meter label="Concurrent runs" used={use.active_runs} limit={limits.max_concurrent_runs} />
      {limits.tokens_per_month != null && (
        <Meter label="Tokens this month" used={use.tokens_this_month ?? 0} limit={limits.tokens_per_month} format={formatNumber} />
      )}
      {limits.kv_bytes_stored != null && (
        // The plan bounds every tenant of the account together: the figures to compare.
        <Meter label="KV bytes stored" used={use.account_kv_bytes_stored ?? use.kv_bytes_stored ?? 0} limit={limits.kv_bytes_stored} format={formatBytes} />
      )}
      {limits.max_kv_files != null && (
        <Meter label="KV files" used={use.account_kv_files ?? use.kv_files ?? 0} limit={limits.max_kv_files} format={formatNumber} />
      )}
      <dl className="facts">
        <dt>Max tokens per run</dt>
        <dd>{formatNumber(limits.max_tokens_per_run)}</dd>
        {deadline !== undefined && (
          <>
            <dt>Max run time</dt>
            <dd>{deadline} s</dd>
          </>
        )}
        {limits.max_device_pages_per_run != null && (
          <>
            <dt>Max device KV pages per run</dt>
            <dd>{formatNumber(limits.max_device_pages_per_run)}</dd>
          </>
        )}
        {limits.kv_pinned_device_share != null && (
          <>
            <dt>Pinned KV files, share of a worker's device pool</dt>
            <dd>{Math.round(limits.kv_pinned_device_share * 100)}%</dd>
          </>
        )}
        {limits.tokens_per_month === null && (
          <>
            <dt>Tokens this month</dt>
            <dd>{formatNumber(use.tokens_this_month ?? 0)} (unlimited)</dd>
          </>
        )}
        {limits.api_requests_per_minute !== undefined && (
          <>
            <dt>API requests per minute</dt>
            <dd>{limits.api_requests_per_minute === null ? "unlimited" : formatNumber(limits.api_requests_per_minute)}</dd>
          </>
        )}
        <dt>Tokens today</dt>
        <dd>{formatNumber(tokensToday)}</dd>
        {quota.allowed_tool_hosts && (
          <>
            <dt>Brokered I/O hosts</dt>
            <dd>{quota.allowed_tool_hosts.length ? quota.allowed_tool_hosts.join(", ") : "none"}</dd>
          </>
        )}
      </dl>
    </section>
  );
}

function InvoiceCard({ invoice }: { invoice: Invoice }) {
  const month = invoice.period_start.slice(0, 7);
  return (
    <details className="invoice">
      <summary>
        <span>
          {month} · {plural(invoice.runs, "run")}
        </span>
        <strong>
          {invoice.total} {invoice.currency}
        </strong>
      </summary>
      <div className="table-wrap">
        <table>
          <caption className="visually-hidden">Line items for {month}</caption>
          <thead>
            <tr>
              <th scope="col">Item</th>
              <th scope="col" className="num">Quantity</th>
              <th scope="col" className="num">Unit price</th>
              <th scope="col" className="num">Amount</th>
            </tr>
          </thead>
          <tbody>
            {invoice.lines.map((l) => (
              <tr key={l.item}>
                <td data-label="">{l.description}</td>
                <td className="num" data-label="Quantity">
                  {formatNumber(Number(l.quantity))}
                </td>
                <td className="num mono" data-label="Unit price">
                  {formatUnitPrice(l.unit_price)}
                </td>
                <td className="num mono" data-label="Amount">
                  {l.amount}
                </td>
              </tr>
            ))}
          </tbody>
          <tfoot>
            <tr>
              <th scope="row" colSpan={3}>
                Total
              </th>
              <td className="num mono">
                <strong>{invoice.total}</strong> {invoice.currency}
              </td>
            </tr>
          </tfoot>
        </table>
      </div>
      {invoice.days && invoice.days.length > 0 && (
        <div className="table-wrap">
          <table data-testid="invoice-days">
            <caption>By day: each day's runs and amount (a run page's cost is part of its day)</caption>
            <thead>
              <tr>
                <th scope="col">Day (UTC)</th>
                <th scope="col" className="num">Runs</th>
                <th scope="col" className="num">Amount</th>
              </tr>
            </thead>
            <tbody>
              {invoice.days.map((d) => (
                <tr key={d.day}>
                  <td className="mono" data-label="">
                    {d.day}
                  </td>
                  <td className="num" data-label="Runs">
                    {formatNumber(d.runs)}
                  </td>
                  <td className="num mono" data-label="Amount">
                    {d.amount}
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
    </details>
  );
}

export function UsagePage() {
  const [range, setRange] = useState(30);
  const to = isoDay(new Date());
  const from = isoDay(new Date(Date.now() - (range - 1) * 86400_000));
  const usage = useAsync(() => getUsage(from, to).then((d) => fillDays(d, from, to)), [from, to]);
  const [grouping, setGrouping] = useState<UsageGrouping>("program");
  // The rows carry the grouping they were fetched for: while another one loads, the table keeps
  // its own header instead of labelling old rows with the new grouping.
  const groups = useAsync(() => getUsageGroups(from, to, grouping).then((rows) => ({ grouping, rows })), [from, to, grouping]);
  const quota = useAsync(getQuota);
  const invoices = useAsync(listInvoices);
  const today = usage.data?.find((d) => d.day === to);
  return (
    <>
      <PageHeader title="Usage & billing">Metered usage of this tenant, plan limits and monthly invoices.</PageHeader>
      <section className="card" aria-labelledby="usage-title">
        <div className="card-head">
          <h2 id="usage-title">Usage per day</h2>
          <div role="group" aria-label="Range" className="segmented">
            {RANGES.map((r) => (
              <button key={r} type="button" className="btn btn-small" aria-pressed={range === r} onClick={() => setRange(r)}>
                {r} days
              </button>
            ))}
          </div>
        </div>
        <AsyncBlock state={usage} label="Loading usage…">
          {(days) => <UsageChart days={days} />}
        </AsyncBlock>
      </section>
      <section className="card" aria-labelledby="breakdown-title">
        <div className="card-head">
          <h2 id="breakdown-title">Who used it</h2>
          <div role="group" aria-label="Breakdown" className="segmented">
            {GROUPINGS.map((g) => (
              <button key={g.value} type="button" className="btn btn-small" aria-pressed={grouping === g.value} onClick={() => setGrouping(g.value)}>
                {g.label}
              </button>
            ))}
          </div>
        </div>
        <AsyncBlock state={groups} label="Loading breakdown…">
          {(data) => <UsageBreakdown groups={data.rows} grouping={data.grouping} />}
        </AsyncBlock>
      </section>
      <div className="grid-2">
        <AsyncBlock state={quota} label="Loading quotas…">
          {(q) => <QuotaMeters quota={q} tokensToday={today ? today.prefill_tokens + today.decode_tokens : 0} />}
        </AsyncBlock>
        <section className="card" aria-labelledby="invoices-title">
          <h2 id="invoices-title">Invoices</h2>
          <AsyncBlock state={invoices} label="Loading invoices…">
            {(list) =>
              list.length ? list.map((inv) => <InvoiceCard key={inv.id} invoice={inv} />) : <Empty>No invoices yet: they appear after the first metered run.</Empty>
            }
          </AsyncBlock>
        </section>
      </div>
    </>
  );
}
