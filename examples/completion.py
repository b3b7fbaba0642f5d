"""Greedy completion, streamed token by token: the smallest useful LIP.

args: ``{"prompt": str, "max_tokens": int = 32, "chat": bool = false}``
Example args: {"prompt": "The capital of France is", "max_tokens": 24}
result: ``{"text": str, "tokens": [int]}``; each new piece of the text is sent with
``send_to_user`` as soon as its token is decoded, so a client watches it arrive.
"""

import symphony as sy


def main(args):
    prompt = args.get("prompt", "Once upon a time")
    if args.get("chat"):
        ids = sy.apply_chat_template([{"role": "user", "content": prompt}])
    else:
        ids = sy.tokenize(prompt)
    stops = set(sy.vocab_info().eos_token_ids)
    kv = sy.kv_create()
    out, sent = [], ""
    feed = ids
    for _ in range(int(args.get("max_tokens", 32))):
        token = sy.pred_token(kv, feed)  # feeds the file `feed`, predicts the next token
        if token in stops:
            break
        out.append(token)
        feed = [token]
        text = sy.detokenize(out, skip_special_tokens=True)
        # A token may end inside a multi-byte character: wait for the rest of it.
        if len(text) > len(sent) and not text.endswith("\ufffd"):
            sy.send_to_user(text[len(sent) :])
            sent = text
    text = sy.detokenize(out, skip_special_tokens=True)
    if text != sent:
        sy.send_to_user(text[len(sent) :])
    kv.close()
    return {"text": text, "tokens": out}
