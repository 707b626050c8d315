"""``tool_choice`` -> the calls an engine answer may make, point by point (issue 21).

The rules are OpenAI's Chat Completions "tool choice" / "allowed tools" (module docstring of
:mod:`prefixgate.local_engine.server.tool_mask`): each case below breaks if one rule is broken
at one point — ``allowed_tools.mode`` defaulting to ``auto`` (not ``required``), the allowed
names kept in the tools' order, ``none`` without tools leaving decoding free, every bad shape a
400 naming ``tool_choice``. Pure functions: no model, no tokenizer.
"""

from __future__ import annotations

from typing import Any

import pytest

from prefixgate.local_engine.server.protocol import ApiError
from prefixgate.local_engine.server.tool_mask import (
    ToolConstraint,
    resolve_tool_constraint,
    tool_name,
    tool_parameters,
)


def chat_tool(name: str, params: Any = None) -> dict[str, Any]:
    fn: dict[str, Any] = {"name": name}
    if params is not None:
        fn["parameters"] = params
    return {"type": "function", "function": fn}


TOOLS = [chat_tool(n) for n in ("alpha", "beta", "gamma")]


def allowed(names: list[str], mode: str | None = None, form: str = "chat") -> dict[str, Any]:
    entries = [{"type": "function", "function": {"name": n}} if form == "chat"
               else {"type": "function", "name": n} for n in names]
    spec: dict[str, Any] = {"tools": entries}
    if mode is not None:
        spec["mode"] = mode
    return {"type": "allowed_tools", "allowed_tools": spec}


def refused(tools: Any, choice: Any) -> ApiError:
    with pytest.raises(ApiError) as err:
        resolve_tool_constraint(tools, choice)
    e = err.value
    assert (e.status, e.param, e.code, e.type) == (400, "tool_choice", "invalid_value",
                                                   "invalid_request_error")
    return e


# ---- tool definitions ---------------------------------------------------------------------

def test_tool_name_reads_the_chat_and_the_responses_forms() -> None:
    assert tool_name(chat_tool("alpha")) == "alpha"
    assert tool_name({"type": "function", "name": "beta"}) == "beta"
    assert tool_name({"type": "function", "function": {"name": 7}}) is None
    assert tool_name({"type": "function", "name": ["x"]}) is None
    assert tool_name({"type": "function"}) is None
    # a function object wins over a stray top-level name
    assert tool_name({"type": "function", "name": "top", "function": {"name": "inner"}}) == "inner"
    assert tool_name({"type": "function", "name": "top", "function": {}}) is None


def test_tool_parameters_reads_both_forms_and_defaults_to_an_empty_object_schema() -> None:
    schema = {"type": "object", "properties": {"q": {"type": "string"}}}
    assert tool_parameters(chat_tool("a", schema)) == schema
    assert tool_parameters({"type": "function", "name": "a", "parameters": schema}) == schema
    empty = {"type": "object", "properties": {}}
    assert tool_parameters(chat_tool("a")) == empty
    assert tool_parameters({"type": "function", "name": "a"}) == empty
    assert tool_parameters(chat_tool("a", "not a schema")) == empty
    assert tool_parameters({"type": "function", "parameters": schema, "function": {}}) == empty


# ---- tool_choice strings ------------------------------------------------------------------

@pytest.mark.parametrize("choice", [None, "auto"])
def test_absent_or_auto_leaves_decoding_free(choice: Any) -> None:
    assert resolve_tool_constraint(TOOLS, choice) is None
    assert resolve_tool_constraint(None, choice) is None


def test_none_forbids_calls_only_when_there_are_tools() -> None:
    assert resolve_tool_constraint(TOOLS, "none") == ToolConstraint("none", ())
    assert resolve_tool_constraint(None, "none") is None
    assert resolve_tool_constraint([], "none") is None
    # a tool without a name defines nothing callable
    assert resolve_tool_constraint([{"type": "function", "function": {}}], "none") is None


def test_required_allows_every_defined_tool_once_in_request_order() -> None:
    tools = [chat_tool("beta"), {"type": "function", "function": {}}, chat_tool("alpha"),
             chat_tool("beta")]
    assert resolve_tool_constraint(tools, "required") == ToolConstraint("required", ("beta", "alpha"))


def test_forcing_without_tools_is_a_400() -> None:
    for choice in ("required", {"type": "function", "function": {"name": "alpha"}}, allowed(["alpha"])):
        e = refused(None, choice)
        assert e.message.startswith("tool_choice forces a tool call but the request defines no tools")
        refused([{"type": "function", "function": {"name": 3}}], choice)


# ---- a named function ---------------------------------------------------------------------

def test_a_named_function_is_required_alone() -> None:
    assert resolve_tool_constraint(TOOLS, {"type": "function", "function": {"name": "gamma"}}) == \
        ToolConstraint("required", ("gamma",))
    assert resolve_tool_constraint(TOOLS, {"type": "function", "name": "beta"}) == \
        ToolConstraint("required", ("beta",))


def test_a_named_function_not_in_tools_is_a_400_naming_it() -> None:
    e = refused(TOOLS, {"type": "function", "function": {"name": "delta"}})
    assert e.message.startswith("tool_choice names 'delta', which is not in 'tools'")


@pytest.mark.parametrize("choice", [
    {"type": "function"},
    {"type": "function", "function": {"name": 5}},
    {"type": "function", "function": "alpha"},
])
def test_a_function_choice_without_a_name_is_a_400(choice: dict[str, Any]) -> None:
    assert refused(TOOLS, choice).message.startswith("Each allowed tool must be")


# ---- allowed_tools ------------------------------------------------------------------------

def test_allowed_tools_mode_defaults_to_auto() -> None:
    """OpenAI: ``mode`` ``auto`` lets the model pick among the allowed tools *or answer text*;
    a missing mode must not force a call."""
    assert resolve_tool_constraint(TOOLS, allowed(["beta"])) == ToolConstraint("auto", ("beta",))


@pytest.mark.parametrize("mode", ["auto", "required"])
def test_allowed_tools_keeps_its_mode(mode: str) -> None:
    assert resolve_tool_constraint(TOOLS, allowed(["gamma"], mode)) == ToolConstraint(mode, ("gamma",))


def test_allowed_names_follow_the_tools_order_not_the_choice_order() -> None:
    got = resolve_tool_constraint(TOOLS, allowed(["gamma", "alpha", "gamma"], "required", "responses"))
    assert got == ToolConstraint("required", ("alpha", "gamma"))
    tools = TOOLS + [chat_tool("alpha")]  # a repeated definition is listed once
    assert resolve_tool_constraint(tools, allowed(["alpha"])) == ToolConstraint("auto", ("alpha",))


@pytest.mark.parametrize("mode", ["none", "sometimes", ""])
def test_allowed_tools_mode_other_than_auto_or_required_is_a_400(mode: str) -> None:
    e = refused(TOOLS, allowed(["alpha"], mode))
    assert e.message.startswith(f"allowed_tools.mode must be 'auto' or 'required', not {mode!r}")


def test_allowed_tools_without_its_object_is_a_400() -> None:
    for spec in (None, ["alpha"], "alpha"):
        e = refused(TOOLS, {"type": "allowed_tools", "allowed_tools": spec})
        assert e.message.startswith("tool_choice of type 'allowed_tools' needs an 'allowed_tools' object")


@pytest.mark.parametrize("tools", [None, [], {"name": "alpha"}, "alpha"])
def test_allowed_tools_list_must_be_a_non_empty_list(tools: Any) -> None:
    spec: dict[str, Any] = {"mode": "auto"}
    if tools is not None:
        spec["tools"] = tools
    e = refused(TOOLS, {"type": "allowed_tools", "allowed_tools": spec})
    assert e.message.startswith("allowed_tools.tools must be a non-empty list of tools")


@pytest.mark.parametrize("entry", ["alpha", {"type": "function"}, {"type": "function", "name": 1},
                                   {"type": "function", "function": {"name": None}}])
def test_an_allowed_entry_without_a_name_is_a_400(entry: Any) -> None:
    spec = {"mode": "auto", "tools": [{"type": "function", "name": "alpha"}, entry]}
    e = refused(TOOLS, {"type": "allowed_tools", "allowed_tools": spec})
    assert e.message.startswith("Each allowed tool must be {'type': 'function', 'function': {'name': ...}}")


def test_allowed_tools_naming_undefined_tools_is_a_400_listing_them_sorted() -> None:
    e = refused(TOOLS, allowed(["zeta", "alpha", "delta"], "required"))
    assert e.message.startswith("allowed_tools names tools that are not in 'tools': ['delta', 'zeta']")


@pytest.mark.parametrize("choice", ["sometimes", "", {"type": "web_search"}, {"name": "alpha"}, 3])
def test_an_unknown_choice_is_a_400(choice: Any) -> None:
    e = refused(TOOLS, choice)
    assert e.message.startswith("tool_choice must be 'none', 'auto', 'required', a function or allowed_tools")
