"""OpenAPI operations of the plain Django views drf-spectacular cannot see.

``/v1/*`` (api/views/openai.py) and the run events stream (api/views/run_events.py) are async Django
views, not DRF views, so the schema drf-spectacular generates has no trace of them. This postprocessing hook
(``SPECTACULAR_SETTINGS["POSTPROCESSING_HOOKS"]``) adds their operations, written by hand from
what those views accept and answer; docs/API.md has the prose.
"""

from __future__ import annotations

from typing import Any

_ERROR = {
    "type": "object",
    "description": "OpenAI's error envelope",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": "string", "nullable": True},
                "code": {"type": "string", "nullable": True},
            },
            "required": ["message", "type"],
        }
    },
    "required": ["error"],
}

_MESSAGE = {
    "type": "object",
    "properties": {
        "role": {"type": "string", "enum": ["system", "developer", "user", "assistant", "tool"]},
        "content": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}], "nullable": True},
        "name": {"type": "string"},
        "tool_calls": {"type": "array", "items": {"type": "object"}},
        "tool_call_id": {"type": "string"},
    },
    "required": ["role"],
}

#: Sampling parameters beyond OpenAI's chat ones, as vLLM takes them on chat, completions and
#: Responses (api/serializers/openai.py ``VllmSamplingSerializer``).
_VLLM_SAMPLING = {
    "top_k": {"type": "integer", "minimum": 0},
    "min_p": {"type": "number", "minimum": 0, "maximum": 1},
    "presence_penalty": {"type": "number", "minimum": -2, "maximum": 2},
    "frequency_penalty": {"type": "number", "minimum": -2, "maximum": 2},
    "seed": {"type": "integer"},
    "ignore_eos": {"type": "boolean", "description": "the model's end-of-sequence token does not end the answer"},
    "min_tokens": {"type": "integer", "minimum": 0, "description": "no end of sequence before this many tokens"},
    "repetition_penalty": {"type": "number", "exclusiveMinimum": 0, "maximum": 100},
}

_SAMPLING = {
    "model": {"type": "string"},
    "max_tokens": {"type": "integer", "minimum": 1},
    "temperature": {"type": "number", "minimum": 0, "maximum": 2},
    "top_p": {"type": "number", "minimum": 0, "maximum": 1},
    "logit_bias": {"type": "object", "additionalProperties": {"type": "number"}},
    "n": {"type": "integer", "minimum": 1, "maximum": 8},
    "stop": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
    "stop_token_ids": {"type": "array", "items": {"type": "integer"}},
    **_VLLM_SAMPLING,
    "stream": {"type": "boolean"},
    "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
    "user": {"type": "string"},
}

_CHAT_REQUEST = {
    "type": "object",
    "description": "Parameters not listed are refused with a 400 naming them (never silently ignored).",
    "properties": {
        **_SAMPLING,
        "messages": {"type": "array", "items": _MESSAGE},
        "max_completion_tokens": {"type": "integer", "minimum": 1},
        "logprobs": {"type": "boolean"},
        "top_logprobs": {"type": "integer", "minimum": 0, "maximum": 20},
        "response_format": {"type": "object"},
        "tools": {"type": "array", "items": {"type": "object"}},
        "tool_choice": {"oneOf": [{"type": "string", "enum": ["none", "auto", "required"]}, {"type": "object"}]},
        "parallel_tool_calls": {"type": "boolean"},
    },
    "required": ["model", "messages"],
}

_COMPLETION_REQUEST = {
    "type": "object",
    "description": "Parameters not listed are refused with a 400 naming them (never silently ignored).",
    "properties": {
        **_SAMPLING,
        "prompt": {
            "oneOf": [
                {"type": "string"},
                {"type": "array", "items": {"type": "string"}},
                {"type": "array", "items": {"type": "integer"}},
                {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
            ]
        },
        "logprobs": {"type": "integer", "minimum": 0, "maximum": 5},
        "echo": {"type": "boolean"},
        "response_format": {"type": "object"},
    },
    "required": ["model", "prompt"],
}

_COMPLETION = {
    "type": "object",
    "description": "A chat.completion / text_completion object; with stream=true, Server-Sent Events of chunks",
    "properties": {
        "id": {"type": "string"},
        "object": {"type": "string"},
        "created": {"type": "integer"},
        "model": {"type": "string"},
        "choices": {"type": "array", "items": {"type": "object"}},
        "usage": {"type": "object"},
    },
}

_MODEL = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "object": {"type": "string"},
        "created": {"type": "integer"},
        "owned_by": {"type": "string"},
    },
}


def _errors(*codes: int) -> dict[str, Any]:
    return {str(c): {"description": "error", "content": {"application/json": {"schema": _ERROR}}} for c in codes}


def _completion_op(summary: str, request: dict, op_id: str) -> dict[str, Any]:
    return {
        "post": {
            "operationId": op_id,
            "tags": ["openai"],
            "summary": summary,
            "security": [{"ApiKey": []}],
            "requestBody": {"required": True, "content": {"application/json": {"schema": request}}},
            "responses": {
                "200": {
                    "description": "the completion, or its chunks as Server-Sent Events when stream=true",
                    "content": {"application/json": {"schema": _COMPLETION}, "text/event-stream": {}},
                },
                **_errors(400, 401, 403, 405, 408, 413, 429, 500),
            },
        }
    }


def _paths() -> dict[str, Any]:
    model_id = {"name": "model_id", "in": "path", "required": True, "schema": {"type": "string"}}
    run_id = {"name": "run_id", "in": "path", "required": True, "schema": {"type": "string", "format": "uuid"}}
    last = {"name": "last_event_id", "in": "query", "required": False, "schema": {"type": "string"}}
    return {
        "/v1/chat/completions": _completion_op(
            "OpenAI chat completion (served by the built-in LIP)", _CHAT_REQUEST, "openai_chat_completions"
        ),
        "/v1/completions": _completion_op(
            "OpenAI text completion (served by the built-in LIP)", _COMPLETION_REQUEST, "openai_completions"
        ),
        "/v1/models": {
            "get": {
                "operationId": "openai_models",
                "tags": ["openai"],
                "security": [{"ApiKey": []}],
                "responses": {
                    "200": {
                        "description": "the served model",
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "properties": {
                                        "object": {"type": "string"},
                                        "data": {"type": "array", "items": _MODEL},
                                    },
                                }
                            }
                        },
                    },
                    **_errors(401, 405),
                },
            }
        },
        "/v1/models/{model_id}": {
            "get": {
                "operationId": "openai_model",
                "tags": ["openai"],
                "security": [{"ApiKey": []}],
                "parameters": [model_id],
                "responses": {
                    "200": {"description": "the model", "content": {"application/json": {"schema": _MODEL}}},
                    **_errors(401, 404, 405),
                },
            }
        },
        "/api/v1/runs/{run_id}/events": {
            "get": {
                "operationId": "runs_events",
                "tags": ["runs"],
                "summary": "The run's events as Server-Sent Events (token, message, status, end), resumable",
                "security": [{"ApiKey": []}],
                "parameters": [run_id, last],
                "responses": {
                    "200": {"description": "an event stream", "content": {"text/event-stream": {}}},
                    "204": {"description": "the stream had ended before Last-Event-ID"},
                    "400": {"description": "a malformed Last-Event-ID"},
                    "401": {"description": "no or a wrong API key"},
                    "404": {"description": "no such run of this tenant"},
                    "429": {"description": "too many open streams (Retry-After)"},
                },
            }
        },
    }


_RESPONSE_REQUEST = {
    "type": "object",
    "description": (
        "OpenAI's Responses API request (api/serializers/responses.py). Parameters not listed are "
        "refused with a 400 naming them (never silently ignored)."
    ),
    "properties": {
        "model": {"type": "string"},
        "input": {
            "oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}],
            "description": "text, or message / function_call / function_call_output items",
        },
        "instructions": {"type": "string"},
        "previous_response_id": {"type": "string"},
        "store": {"type": "boolean", "default": True},
        "background": {"type": "boolean"},
        "stream": {"type": "boolean"},
        "tools": {"type": "array", "items": {"type": "object"}, "description": "function tools"},
        "tool_choice": {"oneOf": [{"type": "string", "enum": ["none", "auto", "required"]}, {"type": "object"}]},
        "parallel_tool_calls": {"type": "boolean"},
        "max_output_tokens": {"type": "integer", "minimum": 1},
        "temperature": {"type": "number", "minimum": 0, "maximum": 2},
        "top_p": {"type": "number", "minimum": 0, "maximum": 1},
        **_VLLM_SAMPLING,
        "text": {"type": "object", "description": "format: text, json_object or json_schema"},
        "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
        "user": {"type": "string"},
        "truncation": {"type": "string", "enum": ["disabled"]},
        "include": {"type": "array", "maxItems": 0},
    },
    "required": ["model", "input"],
}

_RESPONSE = {
    "type": "object",
    "description": "A response object; with stream=true, Server-Sent Events of the Responses event types",
    "properties": {
        "id": {"type": "string"},
        "object": {"type": "string", "enum": ["response"]},
        "status": {"type": "string"},
        "output": {"type": "array", "items": {"type": "object"}},
        "usage": {"type": "object", "nullable": True},
        "previous_response_id": {"type": "string", "nullable": True},
    },
}


def _responses_paths() -> dict[str, Any]:
    rid = {"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}
    one = {"200": {"description": "the response", "content": {"application/json": {"schema": _RESPONSE}}}}

    def op(op_id: str, summary: str, **extra: Any) -> dict[str, Any]:
        return {"operationId": op_id, "tags": ["openai"], "summary": summary, "security": [{"ApiKey": []}], **extra}

    return {
        "/v1/responses": {
            "post": op(
                "openai_responses_create",
                "OpenAI Responses API: create (served by the built-in LIP; stored turns keep their KV)",
                requestBody={"required": True, "content": {"application/json": {"schema": _RESPONSE_REQUEST}}},
                responses={
                    "200": {
                        "description": "the response, or its events as Server-Sent Events when stream=true",
                        "content": {"application/json": {"schema": _RESPONSE}, "text/event-stream": {}},
                    },
                    **_errors(400, 401, 403, 404, 405, 408, 413, 429, 500),
                },
            )
        },
        "/v1/responses/{response_id}": {
            "get": op(
                "openai_responses_retrieve",
                "A stored response",
                parameters=[rid],
                responses={**one, **_errors(401, 404)},
            ),
            "delete": op(
                "openai_responses_delete",
                "Delete a stored response",
                parameters=[rid],
                responses={"200": {"description": "response.deleted"}, **_errors(401, 404)},
            ),
        },
        "/v1/responses/{response_id}/cancel": {
            "post": op(
                "openai_responses_cancel",
                "Cancel a background response",
                parameters=[rid],
                responses={**one, **_errors(400, 401, 404)},
            ),
        },
        "/v1/responses/{response_id}/input_items": {
            "get": op(
                "openai_responses_input_items",
                "The response's own input items",
                parameters=[rid],
                responses={"200": {"description": "a list of items"}, **_errors(401, 404)},
            ),
        },
    }


def add_plain_views(result: dict, generator: object, request: object, public: bool) -> dict:
    """drf-spectacular postprocessing hook: the operations of the non-DRF views."""
    result.setdefault("paths", {}).update(_paths())
    result["paths"].update(_responses_paths())
    return result
