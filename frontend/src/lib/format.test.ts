import { describe, expect, it } from "vitest";
import { formatBytes, formatDuration, formatEpoch, formatUnitPrice, percent } from "./format";
import { fillDays } from "../pages/UsagePage";

describe("format helpers", () => {
  it("formats bytes with binary units", () => {
    expect(formatBytes(512)).toBe("512 B");
    expect(formatBytes(1536)).toBe("1.5 KiB");
    expect(formatBytes(64 * 1024 * 1024)).toBe("64 MiB");
    expect(formatBytes(null)).toBe("—");
  });
  it("formats durations", () => {
    expect(formatDuration("2026-01-01T00:00:00Z", "2026-01-01T00:00:01.5Z")).toBe("1.50 s");
    expect(formatDuration("2026-01-01T00:00:00Z", "2026-01-01T00:02:05Z")).toBe("2 min 5 s");
    expect(formatDuration(null)).toBe("—");
  });
  it("formats epoch seconds and clamps percentages", () => {
    expect(formatEpoch(0)).toBe("1970-01-01 00:00:00 UTC");
    expect(percent(5, 10)).toBe(50);
    expect(percent(15, 10)).toBe(100);
    expect(percent(1, 0)).toBe(0);
  });
  it("shows tiny unit prices per million", () => {
    expect(formatUnitPrice("0.0000004")).toBe("0.4 / 1M");
    expect(formatUnitPrice("0.01")).toBe("0.01");
    expect(formatUnitPrice("n/a")).toBe("n/a");
  });
  it("fills missing usage days with zeros", () => {
    const days = fillDays(
      [{ day: "2026-03-02", runs: 1, prefill_tokens: 10, decode_tokens: 5, pred_calls: 3, page_seconds: 1, io_calls: 0 }],
      "2026-03-01",
      "2026-03-03",
    );
    expect(days.map((d) => d.day)).toEqual(["2026-03-01", "2026-03-02", "2026-03-03"]);
    expect(days[1].decode_tokens).toBe(5);
    expect(days[2].runs).toBe(0);
  });
});
