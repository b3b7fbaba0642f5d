"""Speculative-style decoding with rollback (``kv_truncate``).

A cheap drafter (here: repeat the n-gram that followed the last token earlier in the text, a
"prompt lookup" draft) proposes ``k`` tokens; one ``pred`` scores all of them at once
(``positions`` = every draft row); the longest prefix the model agrees with is kept and the
rest of the KV file is rolled back with ``kv_truncate``. The output is exactly greedy decoding,
in fewer forward passes when drafts are good.

args: ``{"prompt": str, "max_tokens": int = 24, "k": int = 4}``
result: ``{"tokens": [int], "text": str, "forwards": int, "accepted_draft_tokens": int}``
"""

import symphony as sy


def draft(history, k):
    """Propose up to k tokens: what followed the previous occurrence of the last token."""
    last = history[-1]
    for i in range(len(history) - 2, -1, -1):
        if history[i] == last:
            return history[i + 1 : i + 1 + k]
    return []


def main(args):
    max_tokens = int(args.get("max_tokens", 24))
    k = int(args.get("k", 4))
    eos = set(sy.vocab_info().eos_token_ids)
    history = sy.tokenize(args["prompt"])
    kv = sy.kv_create()
    # Invariant: kv holds history[:-1]; history[-1] is the next token to feed.
    if len(history) > 1:
        sy.pred(kv, history[:-1])[0].release()
    out, forwards, accepted = [], 0, 0
    while len(out) < max_tokens:
        guess = draft(history, k)[: max_tokens - len(out)]
        feed = [history[-1], *guess]
        dists = sy.pred(kv, feed, positions=list(range(len(feed))))
        forwards += 1
        choices = [d.argmax() for d in dists]
        sy.release(dists)
        # choices[i] is the model's token after feed[:i+1]; accept draft tokens while they match.
        n_ok = 0
        while n_ok < len(guess) and guess[n_ok] == choices[n_ok]:
            n_ok += 1
        new = [*guess[:n_ok], choices[n_ok]]
        accepted += n_ok
        # Roll back the rejected draft tokens: keep history + accepted drafts.
        sy.kv_truncate(kv, len(history) + n_ok)
        stop = False
        for t in new:
            if t in eos or len(out) >= max_tokens:
                stop = True
                break
            out.append(t)
            history.append(t)
        if stop:
            break
        # kv holds history minus the bonus token: keep the invariant.
        if sy.kv_len(kv) != len(history) - 1:
            raise RuntimeError("KV length out of sync")
    return {"tokens": out, "text": sy.detokenize(out), "forwards": forwards, "accepted_draft_tokens": accepted}
