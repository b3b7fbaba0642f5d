"""Run arguments as PostgreSQL can keep them, and back exactly as the program must see them.

``jsonb`` cannot hold U+0000, yet a prompt may carry it: OpenAI and vLLM accept it, and vLLM's
own benchmark client's random datasets produce it. Arguments with one are stored as their JSON
text (where it is the six characters ``\\u0000``) under one reserved key and decoded before the
program sees them, so the tokens it computes are those of the prompt the client sent.
"""

from __future__ import annotations

import json
from typing import Any

from api.validators import contains_nul

#: The one key of a stored envelope. Arguments that use it themselves are enveloped too, so
#: decoding always gives back what was stored.
ENVELOPE = "__symphony_args_json__"


def storable_args(args: dict[str, Any]) -> dict[str, Any]:
    """``args`` as the run row keeps them (unchanged unless they carry U+0000 or the key)."""
    if not contains_nul(args) and ENVELOPE not in args:
        return args
    return {ENVELOPE: json.dumps(args)}  # ensure_ascii: U+0000 is written as \u0000


def program_args(stored: Any) -> Any:
    """The arguments a run row's ``args`` stand for (what the program and the API show)."""
    if isinstance(stored, dict) and len(stored) == 1 and isinstance(stored.get(ENVELOPE), str):
        return json.loads(stored[ENVELOPE])
    return stored


#: How much of the first argument a run's default name keeps.
NAME_ARG_CHARS = 60


def default_run_name(program_name: str, args: dict) -> str:
    """The program's name and its first argument's value as the client sent it (``story Once
    upon a time``): a string as it is, anything else as JSON, on one line and cut short."""
    first = next(iter(args.values()), None) if args else None
    if first is None:
        return program_name[:200]
    shown = first if isinstance(first, str) else json.dumps(first, ensure_ascii=False)
    shown = " ".join(shown.replace("\x00", "").split())  # one line; PostgreSQL stores no U+0000
    if len(shown) > NAME_ARG_CHARS:
        shown = shown[: NAME_ARG_CHARS - 1].rstrip() + "…"
    return f"{program_name} {shown}".strip()[:200]
