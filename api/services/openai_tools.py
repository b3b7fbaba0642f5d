"""Chat messages and function tools of an OpenAI request, as the built-in LIP's prompt.

The worker's ``apply_chat_template`` takes ``{role, content}`` strings only, so the OpenAI
shapes a template cannot take are rendered here into text, in the format of the Hermes /
Qwen2.5 tool-calling templates (the one most open chat models are trained on):

- the tool definitions are appended to the system prompt (a system message is added when the
  chat has none) between ``<tools></tools>``, one JSON object a line, followed by the
  instruction to answer a call as ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``;
- an assistant message's ``tool_calls`` become such ``<tool_call>`` blocks after its content;
- ``tool`` messages become a user turn of ``<tool_response>`` blocks (consecutive ones merged,
  so templates that insist on alternating roles accept them);
- ``developer`` is the system role.

The LIP generates a call's JSON under a grammar built from the tools' parameter schemas
(:func:`call_schema_text`): what it returns always parses and matches its function's schema.
Schemas travel as JSON *text* because run args are stored in ``jsonb``, which reorders keys,
and xgrammar emits an object's properties in the schema's order.
"""

from __future__ import annotations

import json

#: What opens and closes a tool call in the generated text (see the module docstring).
CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"

TOOLS_PREAMBLE = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_POSTAMBLE = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


def _tools_text(tools: list[dict]) -> str:
    lines = "".join("\n" + json.dumps({"type": "function", "function": t}, ensure_ascii=False) for t in tools)
    return TOOLS_PREAMBLE + lines + TOOLS_POSTAMBLE


def _call_text(call: dict) -> str:
    function = call["function"]
    try:
        arguments = json.loads(function["arguments"])
    except ValueError:
        arguments = function["arguments"]  # what the client sent back, verbatim
    body = json.dumps({"name": function["name"], "arguments": arguments}, ensure_ascii=False)
    return f"{CALL_OPEN}\n{body}\n{CALL_CLOSE}"


def render_messages(messages: list[dict], tools: list[dict] | None) -> list[dict]:
    """The ``{role, content}`` list the chat template receives; ``tools`` (function
    definitions: name, description, parameters) are offered in the system prompt."""
    rendered: list[dict] = []
    for m in messages:
        role, content = m["role"], m.get("content") or ""
        if role == "developer":
            role = "system"
        if role == "assistant" and m.get("tool_calls"):
            calls = "\n".join(_call_text(c) for c in m["tool_calls"])
            content = f"{content}\n{calls}" if content else calls
        if role == "tool":
            block = f"<tool_response>\n{content}\n</tool_response>"
            if rendered and rendered[-1].get("tool_turn"):
                rendered[-1]["content"] += "\n" + block
                continue
            rendered.append({"role": "user", "content": block, "tool_turn": True})
            continue
        rendered.append({"role": role, "content": content})
    if tools:
        text = _tools_text(tools)
        if rendered and rendered[0]["role"] == "system":
            rendered[0]["content"] = f"{rendered[0]['content']}\n\n{text}" if rendered[0]["content"] else text
        else:
            rendered.insert(0, {"role": "system", "content": text})
    return [{"role": m["role"], "content": m["content"]} for m in rendered]


def call_schema_text(tools: list[dict]) -> str:
    """The JSON schema (as text, key order kept) a generated call must match: the name of one
    of ``tools`` and arguments matching that tool's parameters."""
    variants = [
        {
            "type": "object",
            "properties": {"name": {"const": t["name"]}, "arguments": t.get("parameters") or {"type": "object"}},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for t in tools
    ]
    return json.dumps(variants[0] if len(variants) == 1 else {"anyOf": variants}, ensure_ascii=False)
