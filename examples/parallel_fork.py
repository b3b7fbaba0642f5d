"""Prefix KV + parallel decoding: prefill a shared prefix once, ``kv_fork`` it per branch
(copy-on-write: full pages shared) and decode all branches from real threads. The worker
batches the branches' ``pred`` calls into shared forward passes.

args: ``{"prefix": str, "suffixes": [str], "max_tokens": int = 16}``
result: ``{"branches": [{"suffix", "tokens", "text"}], "prefix_tokens": int}``
"""

import threading

import symphony as sy


def main(args):
    prefix = sy.tokenize(args["prefix"])
    root = sy.kv_create()
    # Prefill all but the last prefix token; each branch appends it with its own suffix.
    sy.pred(root, prefix[:-1])[0].release()
    results = [None] * len(args["suffixes"])
    errors = []

    def branch(i, suffix):
        try:
            kv = sy.kv_fork(root)
            toks = sy.generate(kv, prefix[-1:] + sy.tokenize(suffix), max_tokens=int(args.get("max_tokens", 16)))
            results[i] = {"suffix": suffix, "tokens": toks, "text": sy.detokenize(toks)}
            kv.close()
        except Exception as exc:  # reported below, in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=branch, args=(i, s)) for i, s in enumerate(args["suffixes"])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return {"branches": results, "prefix_tokens": len(prefix)}
