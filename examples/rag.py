"""RAG with a persistent, pinned document KV file reused across runs.

The first run prefills the documents into the named KV file ``docs-<corpus>`` (kept after the
run, pinned so memory pressure never evicts it, unless the tenant's plan has no pinned share
left); later runs ``kv_open`` it read-only (a private copy-on-write fork) and only prefill the
question. The answer is identical either way.

args: ``{"corpus": str, "documents": [str], "question": str, "max_tokens": int = 16}``
result: ``{"answer": str, "tokens": [int], "reused": bool, "doc_tokens": int}``
"""

import symphony as sy


def document_kv(corpus, documents):
    """Open the corpus KV file, or build it; returns (read-only fork, reused?)."""
    name = f"docs-{corpus}"
    try:
        return sy.kv_open(name, "r"), True
    except sy.KVNotFound:
        pass
    text = "\n".join(f"Document {i + 1}: {d}" for i, d in enumerate(documents)) + "\n"
    try:
        kv = sy.kv_create(name)
    except sy.KVExists:  # a concurrent run built it first
        return sy.kv_open(name, "r"), True
    sy.release(sy.pred(kv, sy.tokenize(text)))
    try:
        sy.kv_pin(name)
    except sy.QuotaExceeded:  # the plan's share of pinned pages is used: keep it unpinned (spillable)
        pass
    kv.close()  # a named file survives close: this is what later runs reuse
    return sy.kv_open(name, "r"), False


def main(args):
    docs, reused = document_kv(args["corpus"], args.get("documents", []))
    doc_tokens = len(docs)
    question = sy.tokenize(f"Question: {args['question']}\nAnswer:")
    out = sy.generate(docs, question, max_tokens=int(args.get("max_tokens", 16)))
    docs.close()
    return {"answer": sy.detokenize(out), "tokens": out, "reused": reused, "doc_tokens": doc_tokens}
