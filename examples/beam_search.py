"""Beam search in a LIP: each hypothesis is a KV file, expanding it is a ``kv_fork`` (pages
shared copy-on-write, only the partial last page is copied), and the per-step scores come from
``Dist.topk`` computed in the worker. The beams of one step are scored from threads, so their
``pred`` calls share forward passes.

args: ``{"prompt": str, "beams": int = 3, "max_tokens": int = 8}``
result: ``{"beams": [{"tokens": [int], "text": str, "logprob": float}]}`` best first
"""

import threading

import symphony as sy


def main(args):
    width = int(args.get("beams", 3))
    steps = int(args.get("max_tokens", 8))
    eos = set(sy.vocab_info().eos_token_ids)
    root = sy.kv_create()
    first = sy.pred(root, sy.tokenize(args["prompt"]))[-1].topk(width)
    # A beam: (logprob, tokens, kv whose contents end just before tokens[-1], finished)
    beams = [(lp, [tok], root.fork(), tok in eos) for tok, lp in zip(first.ids, first.logprobs, strict=True)]
    root.close()
    for _ in range(steps - 1):
        expansions = [None] * len(beams)

        def expand(i, beam, expansions=expansions):
            logprob, tokens, kv, done = beam
            if done:
                expansions[i] = [(logprob, tokens, None, True)]
                return
            top = sy.pred(kv, [tokens[-1]])[-1].topk(width)
            expansions[i] = [
                (logprob + lp, [*tokens, tok], kv, tok in eos) for tok, lp in zip(top.ids, top.logprobs, strict=True)
            ]

        threads = [threading.Thread(target=expand, args=(i, b)) for i, b in enumerate(beams)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        candidates = sorted((c for group in expansions for c in group), key=lambda c: -c[0])[:width]
        # Each survivor gets its own KV file: a fork of its parent's (the parent has already
        # consumed tokens[-2]); parents no survivor uses are closed.
        survivors = [(lp, toks, kv.fork() if kv is not None else None, done) for lp, toks, kv, done in candidates]
        for _, _, kv, _ in beams:
            if kv is not None:
                kv.close()
        beams = survivors
    for _, _, kv, _ in beams:
        if kv is not None:
            kv.close()
    return {
        "beams": [{"tokens": toks, "text": sy.detokenize(toks), "logprob": lp} for lp, toks, _, _ in beams],
    }
