import type { Series } from "./charts";

export function Legend({ series, latest }: { series: Series[]; latest?: boolean }) {
  return (
    <ul className="legend">
      {series.map((s) => (
        <li key={s.key}>
          <span className="swatch" style={{ background: s.color }} aria-hidden="true" />
          {s.label}
          {latest && s.values.length > 0 && <strong> {s.values[s.values.length - 1]}</strong>}
        </li>
      ))}
    </ul>
  );
}
