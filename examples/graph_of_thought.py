"""Graph-of-Thought in a LIP: fork a shared context into several "thoughts", generate them in
parallel threads, score each by its mean token log-probability under the model, then merge the
best two (``kv_merge``: the second thought's KV is re-positioned after the first's) and
continue generating from the merged context.

args: ``{"question": str, "seeds": [str], "thought_tokens": int = 6, "final_tokens": int = 6}``
result: ``{"thoughts": [{"seed", "text", "score"}], "chosen": [int, int], "merged_tokens": int,
          "answer": str}``
"""

import threading

import symphony as sy


def think(root, seed, n):
    """Generate ``n`` greedy tokens after ``seed`` on a fork of ``root``; returns (kv, ids, score)."""
    kv = root.fork()
    feed = sy.tokenize(seed)
    ids, logprobs = [], []
    for _ in range(n):
        dist = sy.pred(kv, feed)[-1]
        top = dist.topk(1)
        ids.append(top.ids[0])
        logprobs.append(top.logprobs[0])
        feed = [top.ids[0]]
    sy.pred(kv, feed)[-1].release()  # the last token joins the KV, so the thought is complete
    return kv, ids, sum(logprobs) / len(logprobs)


def main(args):
    seeds = list(args["seeds"])
    root = sy.kv_create()
    sy.pred(root, sy.tokenize(args["question"]))[-1].release()
    results = [None] * len(seeds)

    def run(i):
        results[i] = think(root, seeds[i], int(args.get("thought_tokens", 6)))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(seeds))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ranked = sorted(range(len(seeds)), key=lambda i: -results[i][2])
    best, second = ranked[0], ranked[1]
    # Merge: the second thought's tokens (after the shared question) follow the best thought.
    tail = results[second][0].extract(len(root), len(results[second][0]))
    merged = sy.kv_merge(results[best][0], tail)
    merged_tokens = len(merged)
    answer = sy.generate(merged, sy.tokenize(" So the answer is"), int(args.get("final_tokens", 6)))
    thoughts = [
        {"seed": seed, "text": sy.detokenize(results[i][1]), "score": results[i][2]} for i, seed in enumerate(seeds)
    ]
    return {
        "thoughts": thoughts,
        "chosen": [best, second],
        "merged_tokens": merged_tokens,
        "answer": sy.detokenize(answer),
    }
