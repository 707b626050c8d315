"""A forced-tool-choice test set: tools, prompts and choices, and a validity check of answers.

Shared by the engine tests (tiny and real model) and ``bench/forced_tools.py``.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 40},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "book_table", "description": "Book a restaurant table",
        "parameters": {"type": "object", "properties": {
            "restaurant": {"type": "string", "maxLength": 40},
            "people": {"type": "integer", "minimum": 1, "maximum": 20},
            "outdoor": {"type": "boolean"}},
            "required": ["restaurant", "people"]}}},
    {"type": "function", "function": {
        "name": "add_tags", "description": "Tag a document",
        "parameters": {"type": "object", "properties": {
            "doc_id": {"type": "integer"},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 12},
                     "maxItems": 4}},
            "required": ["doc_id", "tags"]}}},
]
PROMPTS = [
    "What's the weather like in Paris?",
    "Book a table for 4 at Chez Marie, outside if possible.",
    "Tag document 17 as urgent and finance.",
    "Hello! How are you today?",
]
CHOICES: list[Any] = [
    "required",
    {"type": "function", "function": {"name": "book_table"}},
    {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [
        {"type": "function", "function": {"name": "get_weather"}},
        {"type": "function", "function": {"name": "add_tags"}}]}},
]


def allowed_names(choice: Any) -> set[str]:
    """The tool names ``choice`` (one of :data:`CHOICES`) lets the answer call."""
    if choice == "required":
        return {t["function"]["name"] for t in TOOLS}
    if choice["type"] == "function":
        return {choice["function"]["name"]}
    return {t["function"]["name"] for t in choice["allowed_tools"]["tools"]}


def valid_forced_answer(body: dict[str, Any], choice: Any) -> bool:
    """True when a chat completion ``body`` is one call of an allowed tool whose arguments
    validate against its schema, with finish reason ``tool_calls``."""
    choice0 = body["choices"][0]
    calls = choice0["message"].get("tool_calls") or []
    if choice0["finish_reason"] != "tool_calls" or len(calls) != 1:
        return False
    fn = calls[0]["function"]
    if fn["name"] not in allowed_names(choice):
        return False
    schema = next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == fn["name"])
    try:
        jsonschema.validate(json.loads(fn["arguments"]), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True
