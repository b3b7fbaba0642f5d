import { niceMax, type Series } from "./charts";
import { Legend } from "./Legend";
import { useElementWidth } from "../hooks/useElementWidth";

interface BarChartProps {
  title: string;
  labels: string[];
  series: Series[];
  height?: number;
}

const PAD = { l: 48, r: 8, t: 8, b: 24 };

/** Stacked bars, one per label (e.g. per day), as inline SVG. */
export function BarChart({ title, labels, series, height = 200 }: BarChartProps) {
  const [ref, W] = useElementWidth<HTMLElement>();
  const totals = labels.map((_, i) => series.reduce((sum, s) => sum + (s.values[i] ?? 0), 0));
  const max = niceMax(Math.max(0, ...totals));
  const w = W - PAD.l - PAD.r;
  const h = height - PAD.t - PAD.b;
  const slot = labels.length ? w / labels.length : w;
  const bar = Math.max(1, slot * 0.7);
  const every = Math.max(1, Math.ceil(labels.length / Math.max(2, Math.floor(w / 70))));
  return (
    <figure className="chart" ref={ref}>
      <svg viewBox={`0 0 ${W} ${height}`} role="img" aria-label={`${title}: ${labels.length} bars, peak ${Math.max(0, ...totals)}`} width={W} height={height}>
        <title>{title}</title>
        <g transform={`translate(${PAD.l},${PAD.t})`}>
          {[0, 0.5, 1].map((f) => (
            <g key={f}>
              <line x1={0} x2={w} y1={h - f * h} y2={h - f * h} className="grid" />
              <text x={-6} y={h - f * h + 4} className="axis" textAnchor="end">
                {compact(max * f)}
              </text>
            </g>
          ))}
          {labels.map((label, i) => {
            let y = h;
            return (
              <g key={label} transform={`translate(${i * slot + (slot - bar) / 2},0)`}>
                <title>{`${label}: ${series.map((s) => `${s.label} ${s.values[i] ?? 0}`).join(", ")}`}</title>
                {series.map((s) => {
                  const bh = ((s.values[i] ?? 0) / max) * h;
                  y -= bh;
                  return <rect key={s.key} x={0} y={y} width={bar} height={bh} fill={s.color} />;
                })}
                {i % every === 0 && (
                  <text x={bar / 2} y={h + 16} className="axis" textAnchor="middle">
                    {label.slice(5)}
                  </text>
                )}
              </g>
            );
          })}
        </g>
      </svg>
      <figcaption>
        <Legend series={series} />
      </figcaption>
    </figure>
  );
}

function compact(n: number): string {
  return new Intl.NumberFormat("en-US", { notation: "compact", maximumFractionDigits: 1 }).format(n);
}
