// Pure state of a run's live event stream (GET /api/v1/runs/<id>/events), so the reducer is
// testable without EventSource. Event types and payloads (api/views/run_events.py, gpu_worker):
//   token   {text}                         text the LIP sent with send_to_user(str)
//   message {data}                         JSON the LIP sent with send_to_user(obj)
//   kv      {run_pages, tenant_device_pages, tenant_host_pages, tokens}  this run's and its tenant's own
//   channel {channel, op, data, bytes}     a message this run sent to a run of its tree
//                                          (op "send": one receiver, "publish": subscribers)
//   status  {status, error?}
//   end     {status, result?}              last event; the stream closes after it

export interface KVSample {
  t: number; // when the server published it (epoch ms: hooks/useRunEvents.ts eventTime)
  run_pages: number; // device pages this run's files hold (what page-seconds bill)
  tenant_device_pages: number;
  tenant_host_pages: number;
  tokens: number;
}

export interface ChannelSent {
  channel: string;
  op: string;
  data: unknown;
  bytes: number;
}

export interface RunStreamState {
  text: string;
  tokens: number;
  messages: unknown[];
  channel: ChannelSent[];
  kv: KVSample[];
  status: string | null;
  error: string | null;
  result: unknown;
  ended: boolean;
  firstTokenAt: number | null;
  lastEventId: string | null;
}

export const initialStreamState: RunStreamState = {
  text: "",
  tokens: 0,
  messages: [],
  channel: [],
  kv: [],
  status: null,
  error: null,
  result: undefined,
  ended: false,
  firstTokenAt: null,
  lastEventId: null,
};

export interface StreamEvent {
  type: string;
  data: string;
  id?: string | null;
  t: number;
}

export const MAX_KV_SAMPLES = 600;
/** Channel messages kept for display: the latest ones (a run may send thousands). */
export const MAX_CHANNEL_EVENTS = 200;

function num(v: unknown): number {
  return typeof v === "number" && Number.isFinite(v) ? v : 0;
}

export function reduceRunEvent(state: RunStreamState, ev: StreamEvent): RunStreamState {
  let payload: Record<string, unknown> = {};
  try {
    const parsed: unknown = JSON.parse(ev.data);
    if (parsed && typeof parsed === "object") payload = parsed as Record<string, unknown>;
  } catch {
    return state;
  }
  const next: RunStreamState = { ...state, lastEventId: ev.id ?? state.lastEventId };
  switch (ev.type) {
    case "token": {
      const text = typeof payload.text === "string" ? payload.text : "";
      return {
        ...next,
        text: state.text + text,
        tokens: state.tokens + 1,
        firstTokenAt: state.firstTokenAt ?? ev.t,
      };
    }
    case "message":
      return { ...next, messages: [...state.messages, payload.data] };
    case "channel": {
      const sent: ChannelSent = {
        channel: typeof payload.channel === "string" ? payload.channel : "",
        op: typeof payload.op === "string" ? payload.op : "send",
        data: payload.data,
        bytes: num(payload.bytes),
      };
      return { ...next, channel: [...state.channel, sent].slice(-MAX_CHANNEL_EVENTS) };
    }
    case "kv": {
      const sample: KVSample = {
        t: ev.t,
        run_pages: num(payload.run_pages),
        tenant_device_pages: num(payload.tenant_device_pages),
        tenant_host_pages: num(payload.tenant_host_pages),
        tokens: num(payload.tokens),
      };
      return { ...next, kv: [...state.kv, sample].slice(-MAX_KV_SAMPLES) };
    }
    case "status":
      return {
        ...next,
        status: typeof payload.status === "string" ? payload.status : state.status,
        error: typeof payload.error === "string" && payload.error ? payload.error : state.error,
      };
    case "end":
      return {
        ...next,
        ended: true,
        status: typeof payload.status === "string" ? payload.status : state.status,
        result: "result" in payload ? payload.result : state.result,
      };
    default:
      return next;
  }
}
