"""Built-in LIP behind ``/v1/chat/completions`` and ``/v1/completions``.

It runs like any tenant program (same sandbox, same worker session, same billing): the API
turns an OpenAI request into ``args`` and this program into the response. ``n`` choices share
the prompt's KV through ``kv_fork`` and decode in threads, so the worker batches them.

args: ``messages`` (chat) or ``prompt`` (completion), ``max_tokens``, ``temperature``,
``top_p``, ``seed``, ``n``, ``stop`` (list of strings), ``json_schema`` (dict or None).
Streams ``{"index": i, "delta": text}`` messages; returns ``{"choices": [...], "usage": ...}``.
"""

import threading

from symphony import (
    apply_chat_template,
    detokenize,
    grammar,
    kv_create,
    kv_fork,
    pred,
    send_to_user,
    tokenize,
    vocab_info,
)


def _held_back(text, stops):
    """How many trailing characters could still grow into a stop string (not streamed yet)."""
    hold = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:k]):
                hold = max(hold, k)
                break
    return hold


def _decode(index, kv, first, args, eos, compiled, out):
    stops = args.get("stop") or []
    temperature = float(args.get("temperature", 1.0))
    seed = args.get("seed")
    # The worker advances the grammar state by each token it picks (one call a token); the
    # grammar allows EOS only once the output is complete, so EOS is where it ends.
    mask = compiled.state().advancing() if compiled is not None else None
    dist, ids, sent, finish = first, [], "", "length"
    for step in range(int(args["max_tokens"])):
        step_seed = None if seed is None else int(seed) * 1_000_003 + index * 10_007 + step
        if temperature <= 0:
            tok = dist.argmax(mask=mask)
        else:
            tok = dist.sample(temperature, float(args.get("top_p", 1.0)), seed=step_seed, mask=mask)
        if tok in eos:
            finish = "stop"
            break
        ids.append(tok)
        text = detokenize(ids)
        cut = min((text.find(s) for s in stops if s in text), default=-1)
        if cut >= 0:
            text, finish = text[:cut], "stop"
        stable = text if finish == "stop" else text[: len(text) - _held_back(text, stops)]
        if stable.endswith("\ufffd") and finish != "stop":
            stable = stable[:-1]  # an incomplete multi-byte character: wait for the next token
        if len(stable) > len(sent) and stable.startswith(sent):
            send_to_user({"index": index, "delta": stable[len(sent) :]})
            sent = stable
        if finish == "stop":
            break
        dist = pred(kv, [tok])[-1]
    text = detokenize(ids)
    cut = min((text.find(s) for s in stops if s in text), default=-1)
    text = text[:cut] if cut >= 0 else text
    if len(text) > len(sent) and text.startswith(sent):
        send_to_user({"index": index, "delta": text[len(sent) :]})
    out[index] = {"index": index, "text": text, "finish_reason": finish, "completion_tokens": len(ids)}


def main(args):
    if "messages" in args:
        prompt = apply_chat_template(args["messages"], add_generation_prompt=True)
    else:
        prompt = tokenize(args["prompt"])
    eos = set(vocab_info().eos_token_ids)
    schema = args.get("json_schema")
    compiled = grammar(schema) if schema is not None else None
    n = int(args.get("n", 1))
    root = kv_create()
    first = pred(root, prompt)[-1]
    kvs = [root] + [kv_fork(root) for _ in range(n - 1)]
    choices = [None] * n
    errors = []

    def decode(i):
        try:
            _decode(i, kvs[i], first, args, eos, compiled, choices)
        except Exception as exc:  # re-raised below so the run fails with the real cause
            errors.append(exc)

    threads = [threading.Thread(target=decode, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    completion = sum(c.pop("completion_tokens") for c in choices)
    return {"choices": choices, "usage": {"prompt_tokens": len(prompt), "completion_tokens": completion}}
