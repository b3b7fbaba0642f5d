"""B12 routing's LIP: one small run (uploaded as a program by ``bench/b12_routing.py``).

Token ids in, exactly ``out_tokens`` greedy tokens out (EOS ignored), no tokenizer on the path,
so every run computes the same amount whatever the model says and wherever it is routed.

* ``{"setup": true, "file": name, "context": [ids]}``: prefill ``context`` into the named KV
  file ``name`` and pin it (the file the pinned case's runs declare; it stays on the worker
  that made it, which the control plane's mirror then names).
* ``{"prompt": [ids], "out_tokens": n}``: a fresh anonymous KV, prefill ``prompt``, decode.
* ``{"file": name, "prompt": [ids], "out_tokens": n}``: open ``name`` read-only and fork it
  (the file's tokens are not computed again), then the same on the fork. On a worker that does
  not hold the file, ``kv_open`` fails and so does the run: a misrouted run is an error, not a
  slower success.
"""

import symphony as sy


def main(args):
    if args.get("setup"):
        kv = sy.kv_create(args["file"])
        sy.release(sy.pred(kv, args["context"]))
        sy.kv_pin(args["file"])
        kv.close()  # a named file outlives its handle
        return {"file": args["file"], "tokens": len(args["context"])}
    if args.get("file"):
        shared = sy.kv_open(args["file"], "r")
        kv = shared.fork()
        shared.close()
    else:
        kv = sy.kv_create()
    out = sy.generate(kv, args["prompt"], max_tokens=int(args["out_tokens"]), stop=[])
    kv.close()
    return {"tokens": len(out)}
