import { linePath, niceMax, type Series } from "./charts";
import { Legend } from "./Legend";
import { useElementWidth } from "../hooks/useElementWidth";

interface LineChartProps {
  title: string;
  xs: number[];
  series: Series[];
  height?: number;
  xLabel?: string;
  /** Labels the first, middle and last x under the chart (e.g. seconds). */
  xFormat?: (x: number) => string;
}

const PAD = { l: 40, r: 8, t: 8, b: 22 };
const PAD_TICKS = 38;

/** Multi-series line chart as inline SVG (no chart library); scales to its container. */
export function LineChart({ title, xs, series, height = 180, xLabel, xFormat }: LineChartProps) {
  const [ref, W] = useElementWidth<HTMLElement>();
  const max = niceMax(Math.max(0, ...series.flatMap((s) => s.values)));
  const w = W - PAD.l - PAD.r;
  const bottom = xFormat ? PAD_TICKS : PAD.b;
  const h = height - PAD.t - bottom;
  const x0 = xs[0] ?? 0;
  const x1 = xs[xs.length - 1] ?? 0;
  const ticks = xFormat && xs.length > 1 ? [0, 0.5, 1].map((f) => ({ f, label: xFormat(x0 + (x1 - x0) * f) })) : [];
  const summary = series
    .map((s) => `${s.label}: ${s.values.length ? s.values[s.values.length - 1] : "no data"}`)
    .join(", ");
  return (
    <figure className="chart" ref={ref}>
      <svg viewBox={`0 0 ${W} ${height}`} role="img" aria-label={`${title}. Latest ${summary}`} width={W} height={height}>
        <title>{title}</title>
        <g transform={`translate(${PAD.l},${PAD.t})`}>
          {[0, 0.5, 1].map((f) => (
            <g key={f}>
              <line x1={0} x2={w} y1={h - f * h} y2={h - f * h} className="grid" />
              <text x={-6} y={h - f * h + 4} className="axis" textAnchor="end">
                {+(max * f).toFixed(2)}
              </text>
            </g>
          ))}
          {series.map((s) => (
            <path key={s.key} d={linePath(s.values, xs, max, w, h)} stroke={s.color} className="line" />
          ))}
          {ticks.map(({ f, label }) => (
            <text key={f} x={f * w} y={h + 14} className="axis x-tick" textAnchor={f === 0 ? "start" : f === 1 ? "end" : "middle"}>
              {label}
            </text>
          ))}
          {xLabel && (
            <text x={w} y={h + (ticks.length ? 30 : 16)} className="axis" textAnchor="end">
              {xLabel}
            </text>
          )}
        </g>
      </svg>
      <figcaption>
        <Legend series={series} latest />
      </figcaption>
    </figure>
  );
}
