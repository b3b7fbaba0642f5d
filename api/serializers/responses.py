"""Validation of ``POST /v1/responses`` bodies (OpenAI's Responses API).

Like the chat endpoint's (api/serializers/openai.py), every parameter is honoured or refused
with a 400 naming it; ``null`` counts as not given. ``input`` is a string or a list of items:
messages (roles ``user``, ``assistant``, ``system``, ``developer``; content a string or
``input_text`` / ``output_text`` parts), ``function_call`` and ``function_call_output`` items.
Items become chat messages in :mod:`api.services.responses`; here they are only checked and
normalised to item objects (what a stored response keeps as its input). Their text may carry
U+0000, as OpenAI and ``vllm serve`` take it (vLLM's benchmark client's random prompts do; the
stored response's ``json`` columns keep it, the run's arguments are enveloped:
api/services/run_args.py); ``instructions`` and ``metadata`` may not (DRF's text fields refuse it).
vLLM's sampling extras are taken as on the chat endpoint (``VllmSamplingSerializer``).
"""

from __future__ import annotations

import json

from rest_framework import serializers

from api.serializers.openai import (
    MAX_CONTENT_CHARS,
    MAX_MESSAGES,
    MAX_TOOLS,
    MAX_TOOLS_CHARS,
    FunctionSerializer,
    VllmSamplingSerializer,
    check_min_tokens,
)
from api.validators import storable_json

#: Keys a client may send with these values (OpenAI's defaults), which change nothing here.
DEFAULTS_ACCEPTED = {"truncation": ("disabled",), "include": ([],), "service_tier": ("auto", "default")}
ROLES = ("user", "assistant", "system", "developer")
TEXT_PARTS = ("input_text", "output_text", "text")
MAX_METADATA = 16


class Invalid(Exception):
    """A malformed item: the message and the ``param`` path at fault (``input[2].content``)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.message, self.param = message, param


def _text(content: object, param: str) -> str:
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not (isinstance(part, dict) and part.get("type") in TEXT_PARTS and isinstance(part.get("text"), str)):
                raise Invalid(
                    "only text content parts (input_text / output_text with a 'text' string) are supported",
                    f"{param}[{j}]",
                )
            parts.append(part["text"])
        content = "".join(parts)
    if not isinstance(content, str):
        raise Invalid("content must be a string or a list of text content parts", param)
    if len(content) > MAX_CONTENT_CHARS:
        raise Invalid(f"content is longer than {MAX_CONTENT_CHARS} characters", param)
    return content  # U+0000 included, as OpenAI and vLLM take it (the json column keeps it)


def _string(item: dict, key: str, param: str, limit: int = 200) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value or len(value) > limit:
        raise Invalid(f"'{key}' must be a non-empty string of at most {limit} characters", f"{param}.{key}")
    return value


def normalise_item(item: object, param: str) -> dict:
    """One input item, checked, as the item object a stored response keeps."""
    if not isinstance(item, dict):
        raise Invalid("an input item must be an object", param)
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if role not in ROLES:
            raise Invalid(f"role must be one of {', '.join(ROLES)}", f"{param}.role")
        unknown = set(item) - {"type", "role", "content", "id", "status"}
        if unknown:
            raise Invalid(f"unsupported message item field {sorted(unknown)[0]!r}", param)
        return {"type": "message", "role": role, "content": _text(item.get("content"), f"{param}.content")}
    if kind == "function_call":
        arguments = item.get("arguments")
        if not isinstance(arguments, str) or len(arguments) > MAX_CONTENT_CHARS:
            raise Invalid("'arguments' must be a string (the call's JSON)", f"{param}.arguments")
        return {
            "type": "function_call",
            "call_id": _string(item, "call_id", param),
            "name": _string(item, "name", param, 64),
            "arguments": arguments,
        }
    if kind == "function_call_output":
        output = item.get("output")
        if isinstance(output, list):
            output = _text(output, f"{param}.output")
        if not isinstance(output, str) or len(output) > MAX_CONTENT_CHARS:
            raise Invalid("'output' must be a string", f"{param}.output")
        return {"type": "function_call_output", "call_id": _string(item, "call_id", param), "output": output}
    raise Invalid(
        f"unsupported input item type {kind!r}: this deployment takes message, function_call and "
        "function_call_output items",
        f"{param}.type",
    )


def normalise_input(value: object) -> list[dict]:
    if isinstance(value, str):
        if len(value) > MAX_CONTENT_CHARS:
            raise Invalid(f"input is longer than {MAX_CONTENT_CHARS} characters", "input")
        return [{"type": "message", "role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise Invalid("input must be a string or a non-empty list of items", "input")
    if len(value) > MAX_MESSAGES:
        raise Invalid(f"input may have at most {MAX_MESSAGES} items", "input")
    return [normalise_item(item, f"input[{i}]") for i, item in enumerate(value)]


class ResponseToolSerializer(FunctionSerializer):
    """A Responses function tool: the function's fields at the top level."""

    type = serializers.ChoiceField(choices=["function"], error_messages={"invalid_choice": "only function tools"})


class TextFormatSerializer(serializers.Serializer):
    type = serializers.ChoiceField(choices=["text", "json_object", "json_schema"])
    name = serializers.CharField(required=False, allow_null=True, max_length=64)
    schema = serializers.DictField(required=False, validators=[storable_json])
    strict = serializers.BooleanField(required=False, allow_null=True)
    description = serializers.CharField(required=False, allow_null=True, allow_blank=True, max_length=8192)

    def validate(self, attrs: dict) -> dict:
        if attrs["type"] == "json_schema" and not isinstance(attrs.get("schema"), dict):
            raise serializers.ValidationError("format.schema must be a JSON schema object")
        return attrs


class TextSerializer(serializers.Serializer):
    format = TextFormatSerializer(required=False, allow_null=True)


class ResponseCreateSerializer(VllmSamplingSerializer):
    """OpenAI's parameters, and vLLM's sampling extras as ``vllm serve``'s Responses API takes
    them (``ignore_eos``, ``min_tokens``, ``top_k``, ``min_p``, ``repetition_penalty``, ...)."""

    model = serializers.CharField(max_length=200)
    input = serializers.JSONField()
    instructions = serializers.CharField(
        required=False, allow_null=True, allow_blank=True, max_length=MAX_CONTENT_CHARS
    )
    previous_response_id = serializers.CharField(required=False, allow_null=True, max_length=100)
    store = serializers.BooleanField(default=True, allow_null=True)
    background = serializers.BooleanField(default=False, allow_null=True)
    stream = serializers.BooleanField(default=False, allow_null=True)
    tools = ResponseToolSerializer(many=True, required=False, allow_null=True, max_length=MAX_TOOLS)
    tool_choice = serializers.JSONField(required=False, allow_null=True)
    parallel_tool_calls = serializers.BooleanField(required=False, allow_null=True)
    max_output_tokens = serializers.IntegerField(min_value=1, required=False, allow_null=True)
    temperature = serializers.FloatField(min_value=0.0, max_value=2.0, required=False, allow_null=True)
    top_p = serializers.FloatField(min_value=0.0, max_value=1.0, required=False, allow_null=True)
    text = TextSerializer(required=False, allow_null=True)
    metadata = serializers.DictField(
        child=serializers.CharField(max_length=512, allow_blank=True), required=False, allow_null=True
    )
    user = serializers.CharField(required=False, allow_null=True, allow_blank=True, max_length=256)
    truncation = serializers.JSONField(required=False, allow_null=True)
    include = serializers.JSONField(required=False, allow_null=True)
    service_tier = serializers.JSONField(required=False, allow_null=True)

    def to_internal_value(self, data: object) -> dict:
        if isinstance(data, dict):
            unknown = [k for k, v in data.items() if k not in self.fields and v is not None]
            if unknown:
                raise serializers.ValidationError(
                    {unknown[0]: [f"unsupported parameter: {unknown[0]!r} is not implemented by this deployment"]}
                )
            for key, allowed in DEFAULTS_ACCEPTED.items():
                if data.get(key) is not None and data[key] not in allowed:
                    raise serializers.ValidationError(
                        {key: [f"only {' or '.join(json.dumps(a) for a in allowed)} is supported for {key!r}"]}
                    )
        return super().to_internal_value(data)

    def validate_input(self, value: object) -> list[dict]:
        try:
            return normalise_input(value)
        except Invalid as exc:
            raise serializers.ValidationError(f"{exc.param}: {exc.message}") from None

    def validate_metadata(self, value: dict | None) -> dict | None:
        if value and len(value) > MAX_METADATA:
            raise serializers.ValidationError(f"metadata may have at most {MAX_METADATA} keys")
        return value

    def validate_tools(self, value: list[dict] | None) -> list[dict] | None:
        if not value:
            return None
        if not all(isinstance(t, dict) for t in value):
            raise serializers.ValidationError("each tool must be an object")
        names = [t["name"] for t in value]
        if len(set(names)) != len(names):
            raise serializers.ValidationError("tool function names must be unique")
        if len(json.dumps(self.initial_data.get("tools"))) > MAX_TOOLS_CHARS:
            raise serializers.ValidationError(f"the tools' definitions are longer than {MAX_TOOLS_CHARS} characters")
        return value

    def validate_tool_choice(self, value: object) -> object:
        if value is None or value in ("none", "auto", "required"):
            return value
        if isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("name"), str):
            return {"type": "function", "name": value["name"]}
        raise serializers.ValidationError(
            'tool_choice must be "none", "auto", "required" or {"type": "function", "name": ...}'
        )

    def validate(self, attrs: dict) -> dict:
        choice, tools = attrs.get("tool_choice"), attrs.get("tools")
        if choice not in (None, "none", "auto") and not tools:
            raise serializers.ValidationError({"tool_choice": ["tool_choice needs tools"]})
        if isinstance(choice, dict) and choice["name"] not in {t["name"] for t in tools or []}:
            raise serializers.ValidationError({"tool_choice": [f"no tool named {choice['name']!r} in tools"]})
        fmt = (attrs.get("text") or {}).get("format")
        if tools and choice != "none" and fmt and fmt["type"] != "text":
            raise serializers.ValidationError({"text": ["a JSON text format cannot be combined with tools"]})
        constrained = bool(fmt and fmt["type"] != "text") or bool(tools and choice != "none")
        self.check_sampling_extras(attrs, constrained=constrained, constraints=("text.format", "tools"))
        check_min_tokens(attrs, attrs.get("max_output_tokens"), "max_output_tokens")
        if attrs.get("background") and attrs.get("store") is False:
            raise serializers.ValidationError({"background": ["background responses must be stored (store: true)"]})
        if attrs.get("background") and attrs.get("stream"):
            raise serializers.ValidationError({"background": ["background responses are not streamed here"]})
        return attrs

    def tools_as_written(self) -> list[dict]:
        """The function definitions from the raw body (key order as written), as the chat
        tool machinery takes them: name, description, parameters."""
        out = []
        for tool in self.initial_data.get("tools") or []:
            entry = {"name": tool["name"]}
            if tool.get("description"):
                entry["description"] = tool["description"]
            entry["parameters"] = tool.get("parameters") or {"type": "object", "properties": {}}
            out.append(entry)
        return out

    def schema_as_written(self) -> str | None:
        """``text.format``'s JSON schema as JSON text (key order kept), or ``None``."""
        fmt = (self.validated_data.get("text") or {}).get("format")
        if not fmt or fmt["type"] == "text":
            return None
        if fmt["type"] == "json_object":
            return '{"type": "object"}'
        return json.dumps(self.initial_data["text"]["format"]["schema"], ensure_ascii=False)
