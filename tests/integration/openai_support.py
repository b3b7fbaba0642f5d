"""What the tests driving the stack through the ``openai`` client share: the client as a user
builds it (no retries, so a failure shows as one) and the weather tool they call."""

from __future__ import annotations

import json
from typing import Any

#: The ``get_weather`` function's parameters, as a chat ``tools`` entry and a Responses tool wrap them.
WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 24}, "unit": {"type": "string", "enum": ["c", "f"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
WEATHER_FUNCTION = {
    "name": "get_weather",
    "description": "Current weather in a city",
    "parameters": WEATHER_PARAMETERS,
}


def openai_client(base_url: str, secret: str, timeout: float = 300) -> Any:
    from openai import OpenAI

    return OpenAI(base_url=f"{base_url}/v1", api_key=secret, max_retries=0, timeout=timeout)


def valid_weather(arguments: str) -> dict:
    """A tool call's arguments parsed, checked against ``WEATHER_PARAMETERS`` (the grammar's promise)."""
    value = json.loads(arguments)
    assert set(value) == {"city", "unit"} and value["unit"] in ("c", "f"), value
    assert isinstance(value["city"], str) and len(value["city"]) <= 24, value
    return value
