"""Validation of OpenAI-style request bodies; produces :class:`CompletionRequest`.

Only the parameters the built-in LIP implements are accepted; anything else the OpenAI API
defines is ignored (as OpenAI-compatible servers commonly do) rather than silently faked.
"""

from __future__ import annotations

from rest_framework import serializers

from api.services.openai_compat import CompletionRequest, model_name
from api.validators import reject_nul, storable_json

MAX_CHOICES = 8
MAX_STOPS = 4
DEFAULT_MAX_TOKENS = 256
MAX_CONTENT_CHARS = 200_000


class MessageContentField(serializers.Field):
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
        reject_nul(data)
        return data

    def to_representation(self, value: str) -> str:
        return value


def _is_text_part(part: object) -> bool:
    return isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)


class MessageSerializer(serializers.Serializer):
    role = serializers.ChoiceField(choices=["system", "user", "assistant", "tool"])
    content = MessageContentField()


class ResponseFormatSerializer(serializers.Serializer):
    type = serializers.ChoiceField(choices=["text", "json_object", "json_schema"])
    json_schema = serializers.DictField(required=False, validators=[storable_json])

    def validate(self, attrs: dict) -> dict:
        if attrs["type"] == "json_schema" and not isinstance((attrs.get("json_schema") or {}).get("schema"), dict):
            raise serializers.ValidationError("json_schema.schema must be a JSON schema object")
        return attrs


class StreamOptionsSerializer(serializers.Serializer):
    include_usage = serializers.BooleanField(default=False)


class _CommonSerializer(serializers.Serializer):
    model = serializers.CharField(max_length=200)
    max_tokens = serializers.IntegerField(min_value=1, required=False)
    max_completion_tokens = serializers.IntegerField(min_value=1, required=False)
    temperature = serializers.FloatField(min_value=0.0, max_value=2.0, default=1.0)
    top_p = serializers.FloatField(min_value=0.0, max_value=1.0, default=1.0)
    n = serializers.IntegerField(min_value=1, max_value=MAX_CHOICES, default=1)
    stop = serializers.JSONField(required=False, allow_null=True)
    seed = serializers.IntegerField(required=False, allow_null=True, min_value=0, max_value=2**31)
    stream = serializers.BooleanField(default=False)
    stream_options = StreamOptionsSerializer(required=False, allow_null=True)
    response_format = ResponseFormatSerializer(required=False)

    def validate_stop(self, value: object) -> list[str]:
        reject_nul(value)
        stops = [value] if isinstance(value, str) else value or []
        if not isinstance(stops, list) or len(stops) > MAX_STOPS or not all(isinstance(s, str) and s for s in stops):
            raise serializers.ValidationError(f"stop must be a string or a list of up to {MAX_STOPS} strings")
        return stops

    def to_request(self, chat: bool, source: dict) -> CompletionRequest:
        data = self.validated_data
        max_tokens = data.get("max_completion_tokens") or data.get("max_tokens") or DEFAULT_MAX_TOKENS
        args = {
            **source,
            "max_tokens": max_tokens,
            "temperature": data["temperature"],
            "top_p": data["top_p"],
            "n": data["n"],
            "stop": data.get("stop") or [],
            "seed": data.get("seed"),
            "json_schema": _schema(data.get("response_format")),
        }
        # The run's token budget covers the prompt (unknown before tokenizing: bounded by its
        # characters) and every choice's completion.
        prompt_chars = sum(len(m["content"]) for m in source.get("messages", [])) + len(source.get("prompt", ""))
        return CompletionRequest(
            chat=chat,
            args=args,
            stream=data["stream"],
            include_usage=bool((data.get("stream_options") or {}).get("include_usage")),
            model=model_name(),
            run_max_tokens=prompt_chars + 64 + max_tokens * data["n"],
        )


def _schema(response_format: dict | None) -> dict | None:
    if not response_format or response_format["type"] == "text":
        return None
    if response_format["type"] == "json_object":
        return {"type": "object"}
    return response_format["json_schema"]["schema"]


class ChatCompletionSerializer(_CommonSerializer):
    messages = MessageSerializer(many=True, allow_empty=False)

    def to_completion_request(self) -> CompletionRequest:
        messages = [{"role": m["role"], "content": m["content"]} for m in self.validated_data["messages"]]
        return self.to_request(True, {"messages": messages})


class CompletionSerializer(_CommonSerializer):
    prompt = serializers.CharField(max_length=200_000, allow_blank=False)

    def to_completion_request(self) -> CompletionRequest:
        return self.to_request(False, {"prompt": self.validated_data["prompt"]})
