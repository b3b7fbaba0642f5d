"""Greedy completion: the smallest useful LIP.

args: ``{"prompt": str, "max_tokens": int = 32, "chat": bool = false}``
Example args: {"prompt": "The capital of France is", "max_tokens": 24}
result: ``{"text": str, "tokens": [int]}``; the text is also streamed with ``send_to_user``.
"""

import symphony as sy


def main(args):
    prompt = args.get("prompt", "Once upon a time")
    if args.get("chat"):
        ids = sy.apply_chat_template([{"role": "user", "content": prompt}])
    else:
        ids = sy.tokenize(prompt)
    kv = sy.kv_create()
    out = sy.generate(kv, ids, max_tokens=int(args.get("max_tokens", 32)))
    text = sy.detokenize(out, skip_special_tokens=True)
    sy.send_to_user(text)
    kv.close()
    return {"text": text, "tokens": out}
