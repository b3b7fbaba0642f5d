"""Validation of OpenAI-style request bodies; produces :class:`CompletionRequest`.

Every parameter a request carries is either honoured (implemented by the built-in LIP,
api/builtin_lips/openai_lip.py) or refused with a 400 naming it: nothing is silently
ignored. ``null`` counts as not given, as OpenAI treats it. ``user`` is accepted (an end-user
identifier OpenAI uses for abuse monitoring; it changes nothing in the answer).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, NoReturn

from rest_framework import serializers

from api.services.openai_requests import CompletionRequest, model_name
from api.services.openai_tools import call_schema_text, render_messages
from api.validators import reject_nul, storable_json

MAX_CHOICES = 8
MAX_STOPS = 4
MAX_STOP_TOKEN_IDS = 64
MAX_LOGIT_BIAS = 1024
#: The largest ``repetition_penalty`` taken (vLLM sets none; past this a seen token is as good
#: as barred already, and a bound keeps the value finite).
MAX_REPETITION_PENALTY = 100.0
MAX_TOP_LOGPROBS = 20
MAX_COMPLETION_LOGPROBS = 5
MAX_PROMPTS = 16
#: Choices of one completions request: prompts times ``n``.
MAX_COMPLETION_CHOICES = 32
DEFAULT_MAX_TOKENS = 256
MAX_CONTENT_CHARS = 200_000
#: A chat's length, in messages and in characters of all their contents together (the same
#: bound as a completion's ``prompt``). Past them the prompt cannot fit any context this
#: deployment serves; without them a 3,000-message chat becomes a run that fails (a 500).
MAX_MESSAGES = 1024
MAX_PROMPT_CHARS = 200_000
MAX_PROMPT_TOKENS = 65_536
#: Function tools of one request, and the size of their definitions as JSON: the call grammar
#: is compiled from them (the worker refuses grammar sources over 100,000 characters).
MAX_TOOLS = 64
MAX_TOOLS_CHARS = 60_000
MAX_TOOL_CALLS = 64
#: Message keys OpenAI clients send back with ``null`` (from a response's message object):
#: accepted when null, refused otherwise.
NULLABLE_MESSAGE_KEYS = {"refusal", "audio", "function_call", "annotations"}


class _Field(serializers.Field):
    """A DRF field whose ``fail`` is known to raise (DRF has no type information here)."""

    if TYPE_CHECKING:

        def fail(self, key: str, **kwargs: Any) -> NoReturn: ...


class MessageContentField(_Field):
    """A message's ``content``: a string, or OpenAI's list of content parts, of which the text
    parts are joined (what current OpenAI clients send for multi-part messages). Other part
    types (images, audio) are refused: this model reads text only."""

    default_error_messages = {
        "type": "content must be a string or a list of content parts",
        "part": "only text content parts (type 'text', with a 'text' string) are supported",
        "long": f"content is longer than {MAX_CONTENT_CHARS} characters",
    }

    def to_internal_value(self, data: object) -> str:
        if isinstance(data, list):
            if not all(_is_text_part(p) for p in data):
                self.fail("part")
            data = "".join(p["text"] for p in data)
        if not isinstance(data, str):
            self.fail("type")
        if len(data) > MAX_CONTENT_CHARS:
            self.fail("long")
        return data  # U+0000 included, as OpenAI and vLLM take it (api/services/run_args.py)

    def to_representation(self, value: str) -> str:
        return value


def _is_text_part(part: object) -> bool:
    return isinstance(part, dict) and part.get("type") in ("text", "input_text") and isinstance(part.get("text"), str)


class FunctionCallSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=64)
    arguments = serializers.CharField(allow_blank=True, max_length=MAX_CONTENT_CHARS, trim_whitespace=False)


class ToolCallSerializer(serializers.Serializer):
    id = serializers.CharField(max_length=200)
    type = serializers.ChoiceField(choices=["function"], default="function")
    function = FunctionCallSerializer()


class MessageSerializer(serializers.Serializer):
    role = serializers.ChoiceField(choices=["system", "developer", "user", "assistant", "tool"])
    content = MessageContentField(required=False, allow_null=True)
    name = serializers.CharField(max_length=200, required=False, allow_null=True)
    tool_calls = ToolCallSerializer(many=True, required=False, allow_null=True, max_length=MAX_TOOL_CALLS)
    tool_call_id = serializers.CharField(max_length=200, required=False, allow_null=True)

    def to_internal_value(self, data: object) -> dict:
        if isinstance(data, dict):
            unknown = [
                k for k, v in data.items() if k not in self.fields and (v is not None or k not in NULLABLE_MESSAGE_KEYS)
            ]
            if unknown:
                raise serializers.ValidationError(f"unsupported message field {unknown[0]!r}")
        return super().to_internal_value(data)

    def validate(self, attrs: dict) -> dict:
        role = attrs["role"]
        if not all(isinstance(c, dict) for c in attrs.get("tool_calls") or []):  # a null in a nullable list
            raise serializers.ValidationError("each tool call must be an object")
        if attrs.get("tool_calls") and role != "assistant":
            raise serializers.ValidationError("only assistant messages may have tool_calls")
        if attrs.get("content") is None and not (role == "assistant" and attrs.get("tool_calls")):
            raise serializers.ValidationError("content is required (it may be null only for an assistant's tool_calls)")
        if role == "tool" and not attrs.get("tool_call_id"):
            raise serializers.ValidationError("a tool message needs the tool_call_id it answers")
        return attrs


class ResponseFormatSerializer(serializers.Serializer):
    type = serializers.ChoiceField(choices=["text", "json_object", "json_schema"])
    json_schema = serializers.DictField(required=False, validators=[storable_json])

    def validate(self, attrs: dict) -> dict:
        if attrs["type"] == "json_schema" and not isinstance((attrs.get("json_schema") or {}).get("schema"), dict):
            raise serializers.ValidationError("json_schema.schema must be a JSON schema object")
        return attrs


class StreamOptionsSerializer(serializers.Serializer):
    include_usage = serializers.BooleanField(default=False)


class FunctionSerializer(serializers.Serializer):
    name = serializers.RegexField(
        r"^[A-Za-z0-9_-]{1,64}$", error_messages={"invalid": "function names are 1-64 of a-z, A-Z, 0-9, _ and -"}
    )
    description = serializers.CharField(required=False, allow_blank=True, allow_null=True, max_length=8192)
    parameters = serializers.DictField(required=False, allow_null=True, validators=[storable_json])
    strict = serializers.BooleanField(required=False, allow_null=True)


class ToolSerializer(serializers.Serializer):
    type = serializers.ChoiceField(choices=["function"])
    function = FunctionSerializer()


def _given(initial: dict, name: str) -> bool:
    return initial.get(name) is not None


def check_min_tokens(attrs: dict, limit: int | None, limit_name: str) -> None:
    """``min_tokens`` within the request's token limit (``limit_name`` as the request spells it)."""
    if attrs.get("min_tokens") and limit is not None and attrs["min_tokens"] > limit:
        raise serializers.ValidationError({"min_tokens": [f"min_tokens must not exceed {limit_name}"]})


class VllmSamplingSerializer(serializers.Serializer):
    """vLLM's sampling parameters beyond OpenAI's, which vLLM's own clients send (``vllm bench
    serve`` sets ``ignore_eos`` on every request, chat, completions or Responses): one
    definition, so every endpoint honours them, and refuses the same combinations, alike."""

    top_k = serializers.IntegerField(min_value=-1, required=False, allow_null=True)
    min_p = serializers.FloatField(min_value=0.0, max_value=1.0, required=False, allow_null=True)
    presence_penalty = serializers.FloatField(min_value=-2.0, max_value=2.0, required=False, allow_null=True)
    frequency_penalty = serializers.FloatField(min_value=-2.0, max_value=2.0, required=False, allow_null=True)
    seed = serializers.IntegerField(required=False, allow_null=True, min_value=0, max_value=2**31)
    #: The model's EOS does not end a choice (``ignore_eos``); EOS and ``stop_token_ids`` are
    #: barred until ``min_tokens`` tokens.
    ignore_eos = serializers.BooleanField(required=False, allow_null=True)
    min_tokens = serializers.IntegerField(min_value=0, required=False, allow_null=True)
    #: vLLM's repetition penalty: above 1 a token the prompt or the output already holds is made
    #: less likely, below 1 more (built-in program: ``Sampler``); 1 leaves the choice alone.
    repetition_penalty = serializers.FloatField(
        min_value=0.0, max_value=MAX_REPETITION_PENALTY, required=False, allow_null=True
    )

    def validate_repetition_penalty(self, value: float | None) -> float | None:
        if value is not None and value <= 0:
            raise serializers.ValidationError("repetition_penalty must be greater than 0 (as vLLM answers)")
        return value

    def check_sampling_extras(self, attrs: dict, *, constrained: bool, constraints: tuple[str, str]) -> None:
        """Refuse what cannot be honoured together: ``min_p`` under a grammar (``constrained``:
        a JSON format or tools, the two ``constraints`` as the endpoint spells them), and
        ``ignore_eos`` / ``min_tokens`` under a grammar (it ends at EOS) or with stop strings (one
        seen before ``min_tokens`` would still cut the text where it starts)."""
        fmt, tools = constraints
        if attrs.get("min_p") and constrained:
            raise serializers.ValidationError(
                {"min_p": [f"min_p cannot be combined with {fmt} or {tools} in this deployment"]}
            )
        for name in ("ignore_eos", "min_tokens"):
            if attrs.get(name) and (constrained or attrs.get("stop")):
                raise serializers.ValidationError(
                    {name: [f"{name} cannot be combined with {fmt}, {tools} or stop in this deployment"]}
                )

    def sampling_extras(self) -> dict[str, Any]:
        """These parameters as the built-in program's args take them (defaults filled in)."""
        data = self.validated_data
        return {
            "top_k": max(data.get("top_k") or 0, 0),
            "min_p": data.get("min_p") or 0.0,
            "presence_penalty": data.get("presence_penalty") or 0.0,
            "frequency_penalty": data.get("frequency_penalty") or 0.0,
            "seed": data.get("seed"),
            "ignore_eos": bool(data.get("ignore_eos")),
            "min_tokens": data.get("min_tokens") or 0,
            "repetition_penalty": data.get("repetition_penalty") or 1.0,
        }


class _CommonSerializer(VllmSamplingSerializer):
    #: Request keys accepted besides the declared fields (no effect on the answer).
    ACCEPTED = {"user"}

    model = serializers.CharField(max_length=200)
    max_tokens = serializers.IntegerField(min_value=1, required=False, allow_null=True)
    temperature = serializers.FloatField(min_value=0.0, max_value=2.0, default=1.0, allow_null=True)
    top_p = serializers.FloatField(min_value=0.0, max_value=1.0, default=1.0, allow_null=True)
    logit_bias = serializers.DictField(
        child=serializers.FloatField(min_value=-100.0, max_value=100.0), required=False, allow_null=True
    )
    n = serializers.IntegerField(min_value=1, max_value=MAX_CHOICES, default=1, allow_null=True)
    stop = serializers.JSONField(required=False, allow_null=True)
    stop_token_ids = serializers.ListField(
        child=serializers.IntegerField(min_value=0), required=False, allow_null=True, max_length=MAX_STOP_TOKEN_IDS
    )
    stream = serializers.BooleanField(default=False, allow_null=True)
    stream_options = StreamOptionsSerializer(required=False, allow_null=True)
    response_format = ResponseFormatSerializer(required=False, allow_null=True)
    user = serializers.CharField(required=False, allow_null=True, allow_blank=True, max_length=256)

    def to_internal_value(self, data: object) -> dict:
        if isinstance(data, dict):
            unknown = [k for k in data if k not in self.fields and k not in self.ACCEPTED]
            if unknown:
                raise serializers.ValidationError(
                    {unknown[0]: [f"unsupported parameter: {unknown[0]!r} is not implemented by this deployment"]}
                )
        return super().to_internal_value(data)

    def validate_stop(self, value: object) -> list[str]:
        reject_nul(value)
        stops = [value] if isinstance(value, str) else value or []
        if not isinstance(stops, list) or len(stops) > MAX_STOPS or not all(isinstance(s, str) and s for s in stops):
            raise serializers.ValidationError(f"stop must be a string or a list of up to {MAX_STOPS} strings")
        return stops

    def validate_logit_bias(self, value: dict | None) -> dict[str, float] | None:
        if not value:
            return None
        if len(value) > MAX_LOGIT_BIAS:
            raise serializers.ValidationError(f"logit_bias may have at most {MAX_LOGIT_BIAS} entries")
        if not all(k.isdigit() and len(k) <= 9 for k in value):
            raise serializers.ValidationError("logit_bias keys must be token ids (decimal strings)")
        return {str(int(k)): float(v) for k, v in value.items()}

    def validate(self, attrs: dict) -> dict:
        grammar = bool(attrs.get("response_format") and attrs["response_format"]["type"] != "text")
        self.check_sampling_extras(
            attrs, constrained=grammar or self._uses_tool_grammar(attrs), constraints=("response_format", "tools")
        )
        if attrs.get("stream_options") is not None and not attrs.get("stream"):
            raise serializers.ValidationError(
                {"stream_options": ["stream_options is only allowed when stream is true (as OpenAI answers)"]}
            )
        if attrs.get("max_tokens") is not None and attrs.get("max_completion_tokens") is not None:
            raise serializers.ValidationError(
                {"max_tokens": ["give max_tokens or max_completion_tokens, not both (as OpenAI answers)"]}
            )
        check_min_tokens(attrs, attrs.get("max_tokens") or attrs.get("max_completion_tokens"), "max_tokens")
        return attrs

    def _uses_tool_grammar(self, attrs: dict) -> bool:
        return False

    def sampling_args(self, max_tokens: int) -> dict:
        data = self.validated_data
        args = {
            "max_tokens": max_tokens,
            "temperature": 1.0 if data.get("temperature") is None else data["temperature"],
            "top_p": 1.0 if data.get("top_p") is None else data["top_p"],
            **self.sampling_extras(),
            "logit_bias": data.get("logit_bias") or {},
            "n": data.get("n") or 1,
            "stop": data.get("stop") or [],
            "stop_token_ids": data.get("stop_token_ids") or [],
        }
        schema = _schema(self.initial_data.get("response_format"), data.get("response_format"))
        if schema is not None:
            args["json_schema"] = schema
        return args

    def request(self, chat: bool, args: dict, prompt_chars: int, choices: int) -> CompletionRequest:
        data = self.validated_data
        # The run's token budget covers the prompt (unknown before tokenizing: bounded by its
        # characters) and every choice's completion.
        return CompletionRequest(
            chat=chat,
            args=args,
            stream=bool(data.get("stream")),
            include_usage=bool((data.get("stream_options") or {}).get("include_usage")),
            model=model_name(),
            run_max_tokens=prompt_chars + 64 + args["max_tokens"] * choices,
        )


def _schema(raw: Any, response_format: dict | None) -> str | None:
    """The response's JSON schema as JSON text, in the key order the client wrote it (run args
    are jsonb, which reorders keys; the grammar emits properties in the schema's order)."""
    if not response_format or response_format["type"] == "text":
        return None
    if response_format["type"] == "json_object":
        return '{"type": "object"}'
    return json.dumps(raw["json_schema"]["schema"], ensure_ascii=False)


class ChatCompletionSerializer(_CommonSerializer):
    messages = MessageSerializer(
        many=True,
        allow_empty=False,
        max_length=MAX_MESSAGES,
        error_messages={"max_length": f"a chat may have at most {MAX_MESSAGES} messages"},
    )
    max_completion_tokens = serializers.IntegerField(min_value=1, required=False, allow_null=True)
    logprobs = serializers.BooleanField(required=False, allow_null=True)
    top_logprobs = serializers.IntegerField(min_value=0, max_value=MAX_TOP_LOGPROBS, required=False, allow_null=True)
    tools = ToolSerializer(many=True, required=False, allow_null=True, max_length=MAX_TOOLS)
    tool_choice = serializers.JSONField(required=False, allow_null=True)
    parallel_tool_calls = serializers.BooleanField(required=False, allow_null=True)

    def validate_messages(self, value: list[dict]) -> list[dict]:
        total = sum(len(m.get("content") or "") for m in value)
        total += sum(len(c["function"]["arguments"]) for m in value for c in m.get("tool_calls") or [])
        if total > MAX_PROMPT_CHARS:
            raise serializers.ValidationError(
                f"the messages' contents together are longer than {MAX_PROMPT_CHARS} characters"
            )
        return value

    def validate_tools(self, value: list[dict] | None) -> list[dict] | None:
        if not value:
            return None
        if not all(isinstance(t, dict) for t in value):  # DRF lets a null through a nullable list
            raise serializers.ValidationError("each tool must be an object")
        names = [t["function"]["name"] for t in value]
        if len(set(names)) != len(names):
            raise serializers.ValidationError("tool function names must be unique")
        raw = self.initial_data.get("tools")
        if len(json.dumps(raw)) > MAX_TOOLS_CHARS:
            raise serializers.ValidationError(
                f"the tools' definitions are longer than {MAX_TOOLS_CHARS} characters of JSON"
            )
        return value

    def validate_tool_choice(self, value: object) -> object:
        if value is None or value in ("none", "auto", "required"):
            return value
        if (
            isinstance(value, dict)
            and value.get("type") == "function"
            and isinstance(value.get("function"), dict)
            and isinstance(value["function"].get("name"), str)
        ):
            return {"name": value["function"]["name"]}
        raise serializers.ValidationError(
            'tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}'
        )

    def validate(self, attrs: dict) -> dict:
        attrs = super().validate(attrs)
        choice, tools = attrs.get("tool_choice"), attrs.get("tools")
        if choice not in (None, "none", "auto") and not tools:
            raise serializers.ValidationError({"tool_choice": ["tool_choice needs tools"]})
        if isinstance(choice, dict) and choice["name"] not in {t["function"]["name"] for t in tools or ()}:
            raise serializers.ValidationError({"tool_choice": [f"no tool named {choice['name']!r} in tools"]})
        if tools and attrs.get("response_format") and attrs["response_format"]["type"] != "text":
            raise serializers.ValidationError({"response_format": ["response_format cannot be combined with tools"]})
        if attrs.get("top_logprobs") and not attrs.get("logprobs"):
            raise serializers.ValidationError({"top_logprobs": ["top_logprobs needs logprobs: true"]})
        return attrs

    def _uses_tool_grammar(self, attrs: dict) -> bool:
        return bool(attrs.get("tools")) and attrs.get("tool_choice") != "none"

    def _tools(self) -> list[dict]:
        """The request's function definitions, from the raw body (key order as written)."""
        if not self.validated_data.get("tools"):
            return []
        out = []
        for tool in self.initial_data["tools"]:
            function = tool["function"]
            entry = {"name": function["name"]}
            if function.get("description"):
                entry["description"] = function["description"]
            entry["parameters"] = function.get("parameters") or {"type": "object", "properties": {}}
            out.append(entry)
        return out

    def to_completion_request(self) -> CompletionRequest:
        data = self.validated_data
        tools = self._tools()
        choice = data.get("tool_choice") or ("auto" if tools else "none")
        offered = tools if choice != "none" else []
        messages = render_messages(data["messages"], offered)
        max_tokens = data.get("max_completion_tokens") or data.get("max_tokens") or DEFAULT_MAX_TOKENS
        args = {"messages": messages, **self.sampling_args(max_tokens)}
        if data.get("logprobs"):
            args["logprobs"] = int(data.get("top_logprobs") or 0)
        if offered:
            callable_ = [t for t in offered if not isinstance(choice, dict) or t["name"] == choice["name"]]
            args["tools"] = {
                "call_schema": call_schema_text(callable_),
                "mode": "auto" if choice == "auto" else "required",
                "parallel": data.get("parallel_tool_calls") is not False,
            }
        prompt_chars = sum(len(m["content"]) for m in messages)
        return self.request(True, args, prompt_chars, args["n"])


class PromptField(_Field):
    """A completion's ``prompt``: a string, a list of strings, a list of token ids, or a list
    of lists of token ids (OpenAI's four forms); always a list of prompts internally, each a
    string or a token id list."""

    default_error_messages = {
        "type": "prompt must be a string, a list of strings, a list of token ids or a list of token id lists",
        "count": f"at most {MAX_PROMPTS} prompts",
        "long": f"prompts are longer than {MAX_PROMPT_CHARS} characters together",
        "tokens": f"prompts are more than {MAX_PROMPT_TOKENS} tokens together",
        "empty": "a prompt must not be empty",
    }

    def to_internal_value(self, data: object) -> list:
        if isinstance(data, str):
            data = [data]
        if not isinstance(data, list) or not data:
            self.fail("type")
        if all(_is_token(t) for t in data):
            data = [data]
        prompts: list[str | list[int]] = []
        for p in data:
            if isinstance(p, list) and p and all(_is_token(t) for t in p):
                prompts.append(p)
            elif isinstance(p, str):  # U+0000 included (api/services/run_args.py)
                if not p:
                    self.fail("empty")
                prompts.append(p)
            else:
                self.fail("type")
        if len(prompts) > MAX_PROMPTS:
            self.fail("count")
        if sum(len(p) for p in prompts if isinstance(p, str)) > MAX_PROMPT_CHARS:
            self.fail("long")
        if sum(len(p) for p in prompts if isinstance(p, list)) > MAX_PROMPT_TOKENS:
            self.fail("tokens")
        return prompts

    def to_representation(self, value: list) -> list:
        return value


def _is_token(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31


class CompletionSerializer(_CommonSerializer):
    prompt = PromptField()
    logprobs = serializers.IntegerField(min_value=0, max_value=MAX_COMPLETION_LOGPROBS, required=False, allow_null=True)
    echo = serializers.BooleanField(required=False, allow_null=True)

    def validate(self, attrs: dict) -> dict:
        attrs = super().validate(attrs)
        if len(attrs["prompt"]) * (attrs.get("n") or 1) > MAX_COMPLETION_CHOICES:
            raise serializers.ValidationError({"n": [f"prompts times n must be at most {MAX_COMPLETION_CHOICES}"]})
        return attrs

    def to_completion_request(self) -> CompletionRequest:
        data = self.validated_data
        max_tokens = data.get("max_tokens") or DEFAULT_MAX_TOKENS
        args = {"prompts": data["prompt"], **self.sampling_args(max_tokens)}
        if data.get("logprobs") is not None:
            args["logprobs"] = data["logprobs"]
        if data.get("echo"):
            args["echo"] = True
        prompts = data["prompt"]
        prompt_chars = sum(len(p) for p in prompts)
        return self.request(False, args, prompt_chars, args["n"] * len(prompts))
