import { describe, expect, it } from "vitest";
import type { EngineForward } from "../api/types";
import { describeForward, layoutForwards, longestForwards, summarize } from "./engineTimeline";

function forward(start: number, duration_s: number, batch_size: number, prompt = 0, decode = batch_size, accounts = 1): EngineForward {
  return { start, duration_s, batch_size, prompt_tokens: prompt, decode_tokens: decode, sessions: batch_size, accounts, tokens_per_account: {} };
}

// 100.0-100.1 decode of 4, idle 0.4 s, 100.5-101.0 a prefill of 1 (300 tokens), 101.0-101.1 decode of 8.
const FORWARDS = [forward(100, 0.1, 4), forward(100.5, 0.5, 1, 300, 0), forward(101, 0.1, 8, 0, 8, 2)];

describe("summarize", () => {
  it("says how busy the engine was and the longest gap it waited", () => {
    const s = summarize(FORWARDS)!;
    expect(s.spanS).toBeCloseTo(1.1);
    expect(s.busy).toBeCloseTo(0.7 / 1.1);
    expect(s.longestIdleS).toBeCloseTo(0.4);
    expect(s.meanForwardS).toBeCloseTo(0.7 / 3);
    expect(s.meanBatch).toBeCloseTo(13 / 3);
    expect([s.maxBatch, s.promptTokens, s.decodeTokens, s.maxAccounts]).toEqual([8, 300, 12, 2]);
  });
  it("has nothing to say about no forwards", () => {
    expect(summarize([])).toBeNull();
    expect(layoutForwards([])).toEqual([]);
  });
});

describe("layoutForwards", () => {
  it("places each forward on the span, height by batch size, colour by prefill or decode", () => {
    const bars = layoutForwards(FORWARDS);
    expect(bars.map((b) => Math.round(b.left))).toEqual([0, 45, 91]);
    expect(bars.map((b) => Math.round(b.width))).toEqual([9, 45, 9]);
    expect(bars.map((b) => b.height)).toEqual([50, 12.5, 100]);
    expect(bars.map((b) => b.kind)).toEqual(["decode", "prefill", "decode"]);
  });
  it("keeps a forward shorter than a pixel visible", () => {
    const bars = layoutForwards([forward(0, 0.000001, 1), forward(10, 0.1, 1)]);
    expect(bars[0].width).toBeGreaterThan(0.1);
  });
});

describe("longestForwards and describeForward", () => {
  it("lists the longest first and says what each did", () => {
    expect(longestForwards(FORWARDS, 2)).toEqual([1, 0]);
    expect(describeForward(FORWARDS[1], 0.5)).toBe("at +0.500 s: 500.0 ms, batch 1, 300 prompt + 0 decode tokens, 1 run of 1 account");
  });
});
