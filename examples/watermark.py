"""Watermarked generation (a "green list" watermark, Kirchenbauer et al., 2023) and its detector.

Before each token, the previous token and a secret ``key`` seed a pseudo-random half of the
vocabulary, the green list; ``delta`` is added to the logit of every green token, so the text
leans green without any one token being forced. Anyone with the key recomputes each position's
green list from the token before it and counts how many tokens are green (:func:`detect`):
about half for ordinary text, far more for watermarked text (a z-score says how far).

The bias covers half the vocabulary, past the 4,096 entries a sparse ``bias={...}`` map may hold,
so it is a worker-side bias vector (``sy.bias_set(ids, delta)``), created once per green list and
named by handle in each ``pred_token``. A small cache keeps the vectors of recent previous tokens
(a repeated token reuses its vector) and releases the oldest, staying well inside the session's
caps (``MAX_BIAS_HANDLES``, ``MAX_BIAS_BYTES``: see sandbox/README.md).

args: ``{"prompt": str, "max_tokens": int = 64, "delta": float = 4.0, "key": int = 15485863,
"watermark": bool = true, "temperature": float = 1.0, "seed": int | null}``
result: ``{"tokens": [int], "text": str, "green_fraction": float, "z": float}``

Example args: {"prompt": "Once upon a time", "max_tokens": 48}
"""

import math
import random
from collections import OrderedDict

import symphony as sy

#: Share of the vocabulary that is green at each position.
GAMMA = 0.5
#: Bias vectors kept for reuse (each costs vocab_size * 4 bytes in the worker).
CACHE_SIZE = 8


def green_list(prev_token, vocab_size, key):
    """The green token ids after ``prev_token``: a half of the vocabulary seeded by key and token."""
    rng = random.Random(key * 1_000_003 + prev_token)
    return rng.sample(range(vocab_size), int(vocab_size * GAMMA))


def detect(tokens, vocab_size, key, prev_token):
    """``(green fraction, z-score)`` of ``tokens``; ``prev_token`` is the one before the first
    (the prompt's last). Unwatermarked text scores about ``GAMMA`` and a z near 0."""
    if not tokens:
        return 0.0, 0.0
    green = 0
    for tok in tokens:
        green += tok in set(green_list(prev_token, vocab_size, key))
        prev_token = tok
    n = len(tokens)
    z = (green - GAMMA * n) / math.sqrt(n * GAMMA * (1 - GAMMA))
    return green / n, z


class GreenBiases:
    """The bias vector of each recent previous token, the oldest released past ``CACHE_SIZE``."""

    def __init__(self, vocab_size, key, delta):
        self.vocab_size, self.key, self.delta = vocab_size, key, delta
        self.cache = OrderedDict()

    def after(self, prev_token):
        bias = self.cache.pop(prev_token, None)
        if bias is None:
            bias = sy.bias_set(green_list(prev_token, self.vocab_size, self.key), self.delta)
            while len(self.cache) >= CACHE_SIZE:
                self.cache.popitem(last=False)[1].release()
        self.cache[prev_token] = bias
        return bias

    def close(self):
        for bias in self.cache.values():
            bias.release()
        self.cache.clear()


def main(args):
    max_tokens = int(args.get("max_tokens", 64))
    key = int(args.get("key", 15485863))
    temperature = float(args.get("temperature", 1.0))
    seed = args.get("seed")
    vocab = sy.vocab_info()
    eos = set(vocab.eos_token_ids)
    prompt = sy.tokenize(args["prompt"])
    biases = GreenBiases(vocab.vocab_size, key, float(args.get("delta", 4.0))) if args.get("watermark", True) else None
    kv = sy.kv_create()
    out, pending = [], prompt
    try:
        for i in range(max_tokens):
            bias = biases.after(pending[-1]) if biases is not None else None
            step_seed = None if seed is None else int(seed) * 100_003 + i
            tok = sy.pred_token(kv, pending, temperature, seed=step_seed, bias=bias)
            if tok in eos:
                break
            out.append(tok)
            pending = [tok]
    finally:
        if biases is not None:
            biases.close()
    fraction, z = detect(out, vocab.vocab_size, key, prompt[-1])
    return {"tokens": out, "text": sy.detokenize(out), "green_fraction": fraction, "z": z}
