"""JSON-schema constrained output: the grammar is compiled once in the worker and applied as
a token mask inside sampling, so every output parses and matches the schema.

args: ``{"question": str, "schema": {...} (optional), "max_tokens": int = 96, "seed": int}``
result: the parsed JSON object.
"""

import json

import symphony as sy

DEFAULT_SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "enum": ["yes", "no"]},
        "confidence": {"type": "string", "enum": ["low", "medium", "high"]},
    },
    "required": ["answer", "confidence"],
    "additionalProperties": False,
}


def main(args):
    schema = args.get("schema", DEFAULT_SCHEMA)
    grammar = sy.grammar(schema)
    prompt = sy.apply_chat_template(
        [{"role": "user", "content": f"{args.get('question', 'Is the sky blue?')} Answer as JSON."}]
    )
    kv = sy.kv_create()
    out = sy.generate(
        kv,
        prompt,
        max_tokens=int(args.get("max_tokens", 96)),
        grammar=grammar,
        temperature=float(args.get("temperature", 1.0)),
        seed=args.get("seed", 0),
    )
    text = sy.detokenize(out)
    sy.send_to_user(text)
    return json.loads(text)
