export function formatBytes(n: number | null | undefined): string {
  if (n === null || n === undefined || Number.isNaN(n)) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = n;
  let i = 0;
  while (Math.abs(v) >= 1024 && i < units.length - 1) {
    v /= 1024;
    i += 1;
  }
  return `${i === 0 ? v : v.toFixed(v < 10 ? 1 : 0)} ${units[i]}`;
}

export function formatNumber(n: number | null | undefined): string {
  if (n === null || n === undefined || Number.isNaN(n)) return "—";
  return new Intl.NumberFormat("en-US", { maximumFractionDigits: 2 }).format(n);
}

export function formatDate(iso: string | null | undefined): string {
  if (!iso) return "—";
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return iso;
  return d.toISOString().replace("T", " ").slice(0, 19) + " UTC";
}

/** Seconds between two ISO timestamps (end defaults to now), as "1.2 s" / "3 min 4 s". */
export function formatDuration(startIso: string | null | undefined, endIso?: string | null, now = Date.now()): string {
  if (!startIso) return "—";
  const start = new Date(startIso).getTime();
  const end = endIso ? new Date(endIso).getTime() : now;
  const s = Math.max(0, (end - start) / 1000);
  if (s < 60) return `${s.toFixed(s < 10 ? 2 : 1)} s`;
  const m = Math.floor(s / 60);
  return `${m} min ${Math.round(s - m * 60)} s`;
}

/** Unix seconds (as the worker reports last use) to the same format as formatDate. */
export function formatEpoch(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined) return "—";
  return formatDate(new Date(seconds * 1000).toISOString());
}

export function isoDay(d: Date): string {
  return d.toISOString().slice(0, 10);
}

export function percent(used: number, limit: number): number {
  if (!limit || limit <= 0) return 0;
  return Math.min(100, Math.max(0, (used / limit) * 100));
}

/** A decimal-string unit price; tiny per-token prices read better per million units. */
export function formatUnitPrice(price: string): string {
  const n = Number(price);
  if (!Number.isFinite(n)) return price;
  if (n > 0 && n < 0.001) return `${+(n * 1e6).toPrecision(4)} / 1M`;
  return String(n);
}

/** "1 event", "2 events": a count with its noun (regular plurals; `many` for the others). */
export function plural(n: number, one: string, many = `${one}s`): string {
  return `${formatNumber(n)} ${n === 1 ? one : many}`;
}

/** The sum of decimal-string amounts (USD to the micro-dollar), added in whole micro-dollars so
 * no float rounding creeps in, shown like the API's: six decimals. */
export function sumAmounts(amounts: string[]): string {
  let micros = 0n;
  for (const a of amounts) {
    const m = /^(-?)(\d+)(?:\.(\d{0,6}))?$/.exec(a.trim());
    if (!m) continue;
    const value = BigInt(m[2]) * 1_000_000n + BigInt((m[3] ?? "").padEnd(6, "0") || "0");
    micros += m[1] ? -value : value;
  }
  const sign = micros < 0n ? "-" : "";
  const abs = micros < 0n ? -micros : micros;
  return `${sign}${abs / 1_000_000n}.${(abs % 1_000_000n).toString().padStart(6, "0")}`;
}
