"""A ReAct-style loop: the model writes a thought, the program calls a tool through the
worker's brokered ``http_fetch`` (allowed by the run's host allowlist), feeds the observation
back into the same KV file and continues.

args: ``{"tool_url": str, "question": str, "steps": int = 2, "max_tokens": int = 8}``
result: ``{"observations": [json], "transcript_tokens": int}``
"""

import json

import symphony as sy


def main(args):
    kv = sy.kv_create()
    pending = sy.tokenize(f"Question: {args['question']}\nThought:")
    observations = []
    for step in range(int(args.get("steps", 2))):
        thought = sy.generate(kv, pending, max_tokens=int(args.get("max_tokens", 8)))
        query = sy.detokenize(thought).strip() or "nothing"
        resp = sy.http_fetch(f"{args['tool_url']}?step={step}", method="POST", body=query)
        if resp.status != 200:
            raise RuntimeError(f"tool answered HTTP {resp.status}")
        obs = resp.json()
        observations.append(obs)
        sy.send_to_user({"step": step, "observation": obs})
        pending = sy.tokenize(f"\nObservation: {json.dumps(obs)}\nThought:")
    return {"observations": observations, "transcript_tokens": sy.kv_len(kv)}
