"""``tool_choice`` → constraint, and the bounds that keep a constrained call finite (issue 21),
without a tokenizer: the resolved :class:`ToolConstraint` and the call's JSON schema are checked
directly.

Rules (``tool_mask`` / ``constrained`` module docstrings): an ``allowed_tools`` choice without a
``mode`` is ``auto`` (OpenAI's default); its names keep the order of ``tools``; every string in
the arguments — nested in objects, array items, ``anyOf`` branches or ``$defs`` — without its own
bound gets ``DEFAULT_MAX_STRING`` characters, and every object without ``additionalProperties``
gets ``false``, so no repetition in the grammar is unbounded.
"""

from __future__ import annotations

from typing import Any

from prefixgate.local_engine.server.constrained import DEFAULT_MAX_STRING, call_schema
from prefixgate.local_engine.server.tool_mask import ToolConstraint, resolve_tool_constraint

TOOLS = [{"type": "function", "function": {"name": n}} for n in ("a", "b", "c")]


def test_allowed_tools_without_a_mode_is_auto() -> None:
    choice = {"type": "allowed_tools", "allowed_tools": {"tools": [
        {"type": "function", "function": {"name": "c"}}, {"type": "function", "name": "a"}]}}
    assert resolve_tool_constraint(TOOLS, choice) == ToolConstraint("auto", ("a", "c"))


def test_every_nested_string_and_object_is_bounded() -> None:
    params: dict[str, Any] = {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": "string"}},
            "rows": {"type": "array", "items": {"type": "object", "properties": {
                "k": {"type": "string"}}}},
            "either": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
            "ref": {"$ref": "#/$defs/R"},
            "short": {"type": "string", "maxLength": 3},
            "picked": {"type": "string", "enum": ["x", "y"]},
            "shaped": {"type": "string", "pattern": "^[a-z]+$"},
        },
        "$defs": {"R": {"type": "object", "properties": {"s": {"type": ["string", "null"]}}}},
    }
    schema = call_schema("f", params, max_string=40)
    args = schema["properties"]["arguments"]["properties"]
    assert args["tags"]["items"]["maxLength"] == 40
    assert args["rows"]["items"]["additionalProperties"] is False
    assert args["rows"]["items"]["properties"]["k"]["maxLength"] == 40
    assert args["either"]["anyOf"][0]["maxLength"] == 40 and "maxLength" not in args["either"]["anyOf"][1]
    assert schema["$defs"]["R"]["properties"]["s"]["maxLength"] == 40
    assert schema["$defs"]["R"]["additionalProperties"] is False
    assert args["short"]["maxLength"] == 3
    assert "maxLength" not in args["picked"] and "maxLength" not in args["shaped"]
    assert call_schema("f", {"type": "string"})["properties"]["arguments"]["maxLength"] == DEFAULT_MAX_STRING
    assert params["properties"]["tags"]["items"] == {"type": "string"}  # the client's schema untouched
