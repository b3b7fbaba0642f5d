import { useEffect, useReducer } from "react";
import { runEventsUrl } from "../api/endpoints";
import { initialStreamState, reduceRunEvent, type RunStreamState, type StreamEvent } from "../lib/runEvents";

const EVENT_TYPES = ["token", "message", "channel", "kv", "status", "end"] as const;

type Action = StreamEvent | { type: "__reset" } | { type: "__conn"; connected: boolean };
type State = RunStreamState & { connected: boolean };

function reducer(state: State, action: Action): State {
  if (action.type === "__reset") return { ...initialStreamState, connected: false };
  if (action.type === "__conn") return { ...state, connected: (action as { connected: boolean }).connected };
  return { ...reduceRunEvent(state, action as StreamEvent), connected: state.connected };
}

/** When the server stored an event: its id is the Redis stream entry id, `<ms>-<seq>`, whose
 * milliseconds are the server's clock at publication. Timings taken from it read the same live
 * and when the stream is replayed after a reload; the browser's clock is the fallback. */
export function eventTime(id: string | null | undefined): number {
  const ms = id ? Number(id.split("-")[0]) : NaN;
  return Number.isFinite(ms) && ms > 0 ? ms : Date.now();
}

/** Subscribe to a run's SSE stream while `enabled`; closes after the `end` event. */
export function useRunEvents(runId: string, enabled: boolean): State {
  const [state, dispatch] = useReducer(reducer, { ...initialStreamState, connected: false });

  useEffect(() => {
    dispatch({ type: "__reset" });
  }, [runId]);

  useEffect(() => {
    if (!enabled || typeof EventSource === "undefined") return;
    const source = new EventSource(runEventsUrl(runId), { withCredentials: true });
    source.onopen = () => dispatch({ type: "__conn", connected: true });
    source.onerror = () => dispatch({ type: "__conn", connected: false });
    const handler = (type: string) => (e: MessageEvent<string>) => {
      dispatch({ type, data: e.data, id: e.lastEventId, t: eventTime(e.lastEventId) });
      if (type === "end") {
        source.close();
        dispatch({ type: "__conn", connected: false });
      }
    };
    const listeners = EVENT_TYPES.map((type) => [type, handler(type)] as const);
    for (const [type, fn] of listeners) source.addEventListener(type, fn as EventListener);
    return () => {
      for (const [type, fn] of listeners) source.removeEventListener(type, fn as EventListener);
      source.close();
    };
  }, [runId, enabled]);

  return state;
}
