import { percent } from "../lib/format";

interface MeterProps {
  label: string;
  used: number;
  limit: number;
  format?: (n: number) => string;
}

/** A labelled quota bar (role=meter) that turns amber at 80 % and red at 100 %. */
export function Meter({ label, used, limit, format = String }: MeterProps) {
  const pct = percent(used, limit);
  const tone = pct >= 100 ? "bad" : pct >= 80 ? "warn" : "ok";
  return (
    <div className="meter">
      <div className="meter-head">
        <span>{label}</span>
        <span>
          {format(used)} / {format(limit)}
        </span>
      </div>
      <div
        className="meter-track"
        role="meter"
        aria-label={label}
        aria-valuemin={0}
        aria-valuemax={limit}
        aria-valuenow={used}
      >
        <div className={`meter-fill meter-${tone}`} style={{ width: `${pct}%` }} />
      </div>
    </div>
  );
}
