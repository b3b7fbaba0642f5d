// Geometry shared by the small SVG charts.
export interface Series {
  key: string;
  label: string;
  color: string;
  values: number[];
}

export function niceMax(n: number): number {
  if (n <= 0) return 1;
  const exp = Math.pow(10, Math.floor(Math.log10(n)));
  for (const m of [1, 2, 2.5, 5, 10]) if (n <= m * exp) return m * exp;
  return 10 * exp;
}

/** SVG path "M x y L x y ..." for `values` in a w×h box, y growing downwards. */
export function linePath(values: number[], xs: number[], max: number, w: number, h: number): string {
  if (!values.length) return "";
  const xMin = xs[0];
  const xSpan = Math.max(xs[xs.length - 1] - xMin, 1e-9);
  return values
    .map((v, i) => {
      const x = xs.length === 1 ? w : ((xs[i] - xMin) / xSpan) * w;
      const y = h - (Math.max(0, v) / max) * h;
      return `${i === 0 ? "M" : "L"}${x.toFixed(1)} ${y.toFixed(1)}`;
    })
    .join(" ");
}
