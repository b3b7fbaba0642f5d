const TONES: Record<string, string> = {
  queued: "neutral",
  running: "info",
  succeeded: "ok",
  failed: "bad",
  timed_out: "bad",
  cancelled: "warn",
};

export function StatusBadge({ status }: { status: string }) {
  return <span className={`badge badge-${TONES[status] ?? "neutral"}`}>{status.replace("_", " ")}</span>;
}
