import { describe, expect, it } from "vitest";
import { initialStreamState, MAX_CHANNEL_EVENTS, MAX_KV_SAMPLES, reduceRunEvent, type StreamEvent } from "./runEvents";

const ev = (type: string, data: unknown, t = 0, id = "1-0"): StreamEvent => ({ type, data: JSON.stringify(data), t, id });

describe("reduceRunEvent", () => {
  it("appends token text, counts chunks and remembers the first token time", () => {
    let s = reduceRunEvent(initialStreamState, ev("token", { text: "Hel" }, 120));
    s = reduceRunEvent(s, ev("token", { text: "lo" }, 180, "2-0"));
    expect(s.text).toBe("Hello");
    expect(s.tokens).toBe(2);
    expect(s.firstTokenAt).toBe(120);
    expect(s.lastEventId).toBe("2-0");
  });

  it("records kv samples with every tier and caps the history", () => {
    let s = initialStreamState;
    for (let i = 0; i < MAX_KV_SAMPLES + 5; i++) {
      s = reduceRunEvent(s, ev("kv", { run_pages: i, tenant_device_pages: 3, tenant_host_pages: 1, tokens: 4 }, i));
    }
    expect(s.kv).toHaveLength(MAX_KV_SAMPLES);
    expect(s.kv[s.kv.length - 1]).toEqual({ t: MAX_KV_SAMPLES + 4, run_pages: MAX_KV_SAMPLES + 4, tenant_device_pages: 3, tenant_host_pages: 1, tokens: 4 });
  });

  it("tracks status, error, messages and the end event", () => {
    let s = reduceRunEvent(initialStreamState, ev("status", { status: "running" }));
    s = reduceRunEvent(s, ev("message", { data: { score: 1 } }));
    s = reduceRunEvent(s, ev("status", { status: "failed", error: "boom" }));
    s = reduceRunEvent(s, ev("end", { status: "failed", result: null }));
    expect(s.messages).toEqual([{ score: 1 }]);
    expect(s.status).toBe("failed");
    expect(s.error).toBe("boom");
    expect(s.ended).toBe(true);
    expect(s.result).toBeNull();
  });

  it("keeps the latest channel messages the run sent", () => {
    let s = reduceRunEvent(initialStreamState, ev("channel", { channel: "votes", op: "send", data: { agent: 1 }, bytes: 11 }));
    expect(s.channel).toEqual([{ channel: "votes", op: "send", data: { agent: 1 }, bytes: 11 }]);
    for (let i = 0; i < MAX_CHANNEL_EVENTS + 3; i++) {
      s = reduceRunEvent(s, ev("channel", { channel: "news", op: "publish", data: i, bytes: 1 }));
    }
    expect(s.channel).toHaveLength(MAX_CHANNEL_EVENTS);
    expect(s.channel[s.channel.length - 1].data).toBe(MAX_CHANNEL_EVENTS + 2);
  });

  it("ignores malformed payloads and unknown event types", () => {
    const bad = reduceRunEvent(initialStreamState, { type: "token", data: "{not json", t: 0 });
    expect(bad).toBe(initialStreamState);
    const unknown = reduceRunEvent(initialStreamState, ev("mystery", { x: 1 }));
    expect(unknown.text).toBe("");
  });
});
