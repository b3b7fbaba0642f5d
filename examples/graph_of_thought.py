"""Graph-of-Thought in a LIP: fork a shared context into ``k`` "thoughts", generate them in
parallel threads, score each by its mean token log-probability under the model, merge the best
two (``kv_extract`` + ``kv_merge``: the second thought's KV is re-positioned after the first's),
refine from the merged context, and repeat for ``levels`` levels, each level starting from the
last one's refined context.

Why in a LIP: every thought is a copy-on-write fork of the context the worker already holds, so
the shared prefix is computed once per graph, not once per thought; the merge recomputes only
the second thought's tokens at their new positions (a client over a serving API re-sends the
whole context for each of those calls). B10 (``bench/b10_got.py``) runs :func:`run_graph`
itself against a client loop over ``vllm serve``.

Branches are threads of one run sharing its session. Spawning them as child processes
(``spawn``) pays off when a branch is a program of its own (tool calls, its own deadline or
limits, failures kept apart): the children would share the context through a named KV file
(``kv_create(name)`` here, ``kv_open(name)`` there: a read-only copy-on-write fork). For thoughts
of a few dozen decoded tokens, as here, a fork is a metadata copy while a child costs a sandbox
start, so they stay threads.

args: ``{"question": str, "seeds": [str] (k >= 2), "thought_tokens": int = 6,
"final_tokens": int = 6, "levels": int = 1, "refine": str = " So the answer is"}``
result: ``{"thoughts": [{"seed", "text", "score"}], "chosen": [int, int], "merged_tokens": int,
"answer": str, "levels": [{"thoughts", "chosen", "merged_tokens", "refined"}]}``; the top-level
``thoughts``/``chosen``/``merged_tokens`` are the last level's and ``answer`` its refinement.
"""

import threading

import symphony as sy


def think(s, ctx, pending, seed, n):
    """``n`` greedy tokens after ``pending + seed`` on a fork of ``ctx``, each with its
    log-probability. The last token is not appended (only a merge needs it).

    Returns ``(kv, ids, score)``: score = the mean log-probability of the tokens.
    """
    kv = s.kv_fork(ctx)
    feed = list(pending) + list(seed)
    ids, logprobs = [], []
    for _ in range(n):
        top = s.pred(kv, feed)[-1].topk(1)
        ids.append(top.ids[0])
        logprobs.append(top.logprobs[0])
        feed = [top.ids[0]]
    return kv, ids, sum(logprobs) / len(logprobs)


def level(s, ctx, pending, seeds, refine, thought_tokens, refine_tokens):
    """One level of the graph on context ``ctx`` (``pending``: tokens that follow it, not yet
    computed). Returns the refined context, its pending tokens and what the level chose."""
    base = s.kv_len(ctx) + len(pending)  # where the thoughts' own tokens start
    results = [None] * len(seeds)
    errors = []

    def run(i):
        try:
            results[i] = think(s, ctx, pending, seeds[i], thought_tokens)
        except BaseException as exc:  # re-raised below: a failed thought fails the run
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(seeds))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    ranked = sorted(range(len(seeds)), key=lambda i: (-results[i][2], i))
    best, second = ranked[0], ranked[1]
    best_kv, best_ids, _ = results[best]
    second_kv, second_ids, _ = results[second]
    # The best thought's last token joins its file; the second thought's tokens after the
    # shared context (its last one goes with the refine prompt) follow it in the merged file.
    s.pred(best_kv, [best_ids[-1]])
    tail = s.kv_extract(second_kv, base, s.kv_len(second_kv))
    merged = s.kv_merge(best_kv, tail)
    merged_tokens = s.kv_len(merged) + 1
    for kv, _, _ in results:
        s.kv_close(kv)
    s.kv_close(tail)
    feed = [second_ids[-1], *refine]
    refined = []
    for _ in range(refine_tokens):
        tok = s.pred_token(merged, feed)
        refined.append(tok)
        feed = [tok]
    chose = {
        "thoughts": [(ids, score) for _, ids, score in results],
        "chosen": [best, second],
        "merged_tokens": merged_tokens,
        "refined": refined,
    }
    return merged, feed, chose


def run_graph(s, prompt, levels, thought_tokens, refine_tokens):
    """The whole graph on session ``s``: ``prompt`` token ids, then per level ``(seeds,
    refine)`` (k seed token lists and the refine prompt's ids). Returns one dict per level
    (:func:`level`'s, token ids); every file it opened is closed."""
    ctx = s.kv_create()
    s.pred(ctx, prompt)  # the shared context, computed once for every thought of level 1
    pending = []
    out = []
    for seeds, refine in levels:
        nxt, pending, chose = level(s, ctx, pending, seeds, refine, thought_tokens, refine_tokens)
        s.kv_close(ctx)
        ctx = nxt
        out.append(chose)
    s.kv_close(ctx)
    return out


def main(args):
    s = sy.session()
    seeds = [s.tokenize(seed) for seed in args["seeds"]]
    if len(seeds) < 2:
        raise sy.InvalidArgument("seeds: at least two (the best two thoughts are merged)")
    n_levels = int(args.get("levels", 1))
    thought_tokens = int(args.get("thought_tokens", 6))
    if n_levels < 1 or thought_tokens < 1:
        raise sy.InvalidArgument("levels and thought_tokens must be at least 1")
    refine = s.tokenize(args.get("refine", " So the answer is"))
    levels = run_graph(
        s,
        s.tokenize(args["question"]),
        [(seeds, refine)] * n_levels,
        thought_tokens,
        int(args.get("final_tokens", 6)),
    )
    shown = [
        {
            "thoughts": [
                {"seed": seed, "text": s.detokenize(ids), "score": score}
                for seed, (ids, score) in zip(args["seeds"], lv["thoughts"], strict=True)
            ],
            "chosen": lv["chosen"],
            "merged_tokens": lv["merged_tokens"],
            "refined": s.detokenize(lv["refined"]),
        }
        for lv in levels
    ]
    last = shown[-1]
    return {
        "thoughts": last["thoughts"],
        "chosen": last["chosen"],
        "merged_tokens": last["merged_tokens"],
        "answer": last["refined"],
        "levels": shown,
    }
