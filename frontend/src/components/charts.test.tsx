import { render, screen } from "@testing-library/react";
import { describe, expect, it } from "vitest";
import { BarChart } from "./BarChart";
import { linePath, niceMax } from "./charts";
import { LineChart } from "./LineChart";
import { Meter } from "./Meter";

describe("charts", () => {
  it("rounds axis maxima up to nice numbers", () => {
    expect(niceMax(0)).toBe(1);
    expect(niceMax(7)).toBe(10);
    expect(niceMax(130)).toBe(200);
    expect(niceMax(2400)).toBe(2500);
  });
  it("maps values into the box", () => {
    expect(linePath([0, 10], [0, 1], 10, 100, 50)).toBe("M0.0 50.0 L100.0 0.0");
    expect(linePath([], [], 1, 1, 1)).toBe("");
  });
  it("renders one path per series with an accessible label", () => {
    const { container } = render(
      <LineChart
        title="KV pages"
        xs={[0, 1, 2]}
        series={[
          { key: "a", label: "Device", color: "red", values: [1, 2, 3] },
          { key: "b", label: "Host", color: "blue", values: [0, 0, 1] },
        ]}
      />,
    );
    expect(container.querySelectorAll("path.line")).toHaveLength(2);
    expect(screen.getByRole("img").getAttribute("aria-label")).toContain("Device: 3");
  });
  it("stacks bars per label", () => {
    const { container } = render(
      <BarChart title="Tokens" labels={["2026-01-01", "2026-01-02"]} series={[{ key: "p", label: "P", color: "red", values: [1, 2] }, { key: "d", label: "D", color: "blue", values: [3, 4] }]} />,
    );
    expect(container.querySelectorAll("rect")).toHaveLength(4);
  });
  it("exposes quota meters as role=meter", () => {
    render(<Meter label="Concurrent runs" used={1} limit={2} />);
    const meter = screen.getByRole("meter", { name: "Concurrent runs" });
    expect(meter.getAttribute("aria-valuenow")).toBe("1");
    expect(meter.getAttribute("aria-valuemax")).toBe("2");
  });
});
