"""Request-body schemas of the two model endpoints, for the proxy's OpenAPI document.

The handlers read the raw body themselves (one read under ``max_body_bytes``, orjson, checks in
:mod:`prefixgate.proxy.http.body`), so FastAPI cannot infer a body schema; these are attached with
``openapi_extra`` so ``/openapi.json`` describes what a client sends, and contract fuzzers
(schemathesis, in ``tests/fuzz``) can generate bodies. They state what the proxy itself
requires — the fields :func:`prefixgate.proxy.http.body.check_openai` /
:func:`prefixgate.proxy.http.body.check_anthropic`
check — and the common optional fields; every other field is allowed
(``additionalProperties``): the proxy forwards what it does not read.

Sources: OpenAI Chat Completions API reference (``POST /v1/chat/completions``); Anthropic
Messages API reference (``POST /v1/messages``).
"""

from __future__ import annotations

from typing import Any

_TEXT_PART: dict[str, Any] = {
    "type": "object", "required": ["type", "text"],
    "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
}

_TOOL_CALL: dict[str, Any] = {
    "type": "object", "required": ["id", "type", "function"],
    "properties": {
        "id": {"type": "string"}, "type": {"const": "function"},
        "function": {"type": "object", "required": ["name", "arguments"],
                     "properties": {"name": {"type": "string"}, "arguments": {"type": "string"}}},
    },
}

OPENAI_CHAT_REQUEST: dict[str, Any] = {
    "type": "object",
    "required": ["model", "messages"],
    "properties": {
        "model": {"type": "string", "minLength": 1},
        "messages": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["role"],
            "properties": {
                "role": {"enum": ["system", "developer", "user", "assistant", "tool"]},
                "content": {"anyOf": [{"type": "string"}, {"type": "null"},
                                      {"type": "array", "items": _TEXT_PART}]},
                "tool_calls": {"type": "array", "items": _TOOL_CALL},
                "tool_call_id": {"type": "string"},
                "name": {"type": "string"},
            },
        }},
        "stream": {"type": "boolean"},
        "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
        "max_tokens": {"type": "integer", "minimum": 1},
        "max_completion_tokens": {"type": "integer", "minimum": 1},
        "temperature": {"type": "number", "minimum": 0, "maximum": 2},
        "top_p": {"type": "number", "minimum": 0, "maximum": 1},
        "stop": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
        "tools": {"type": "array", "items": {
            "type": "object", "required": ["type", "function"],
            "properties": {"type": {"const": "function"},
                           "function": {"type": "object", "required": ["name"],
                                        "properties": {"name": {"type": "string"},
                                                       "description": {"type": "string"},
                                                       "parameters": {"type": "object"}}}}}},
        "tool_choice": {"anyOf": [{"enum": ["none", "auto", "required"]}, {"type": "object"}]},
        "user": {"type": "string"},
        "seed": {"type": "integer"},
    },
    "additionalProperties": True,
}

_ANTHROPIC_BLOCK: dict[str, Any] = {
    "type": "object", "required": ["type"],
    "properties": {
        "type": {"enum": ["text", "image", "document", "tool_use", "tool_result"]},
        "text": {"type": "string"},
        "id": {"type": "string"}, "name": {"type": "string"}, "input": {"type": "object"},
        "tool_use_id": {"type": "string"},
        "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART}]},
        "cache_control": {"type": "object", "required": ["type"],
                          "properties": {"type": {"const": "ephemeral"}}},
    },
}

ANTHROPIC_MESSAGES_REQUEST: dict[str, Any] = {
    "type": "object",
    "required": ["model", "max_tokens", "messages"],
    "properties": {
        "model": {"type": "string", "minLength": 1},
        "max_tokens": {"type": "integer", "minimum": 1},
        "messages": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["role", "content"],
            "properties": {
                "role": {"enum": ["user", "assistant"]},
                "content": {"anyOf": [{"type": "string"},
                                      {"type": "array", "items": _ANTHROPIC_BLOCK}]},
            },
        }},
        "system": {"anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART}]},
        "stream": {"type": "boolean"},
        "temperature": {"type": "number", "minimum": 0, "maximum": 1},
        "top_p": {"type": "number", "minimum": 0, "maximum": 1},
        "top_k": {"type": "integer", "minimum": 0},
        "stop_sequences": {"type": "array", "items": {"type": "string"}},
        "metadata": {"type": "object", "properties": {"user_id": {"type": "string"}}},
        "tools": {"type": "array", "items": {
            "type": "object", "required": ["name", "input_schema"],
            "properties": {"name": {"type": "string"}, "description": {"type": "string"},
                           "input_schema": {"type": "object"}}}},
        "tool_choice": {"type": "object", "required": ["type"],
                        "properties": {"type": {"enum": ["auto", "any", "tool", "none"]},
                                       "name": {"type": "string"}}},
    },
    "additionalProperties": True,
}


def request_body(schema: dict[str, Any]) -> dict[str, Any]:
    """``openapi_extra`` for a route whose JSON body follows ``schema`` (required body)."""
    return {"requestBody": {"required": True,
                            "content": {"application/json": {"schema": schema}}}}
