"""Constrained tool calls: whatever the logits, a masked answer is a valid call of an allowed tool.

Random logits are the worst case for validity (a random-weight model, without the model's
cost): each step samples from noise restricted to the grammar's mask. The answer must parse
(``tool_calls.parse_tool_calls``) as exactly one call, of an allowed tool, whose arguments
validate (jsonschema) against that tool's own ``parameters`` schema.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

import jsonschema
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixgate.local_engine.server.constrained import call_schema, tool_call_grammar, tool_call_processor
from prefixgate.local_engine.server.protocol import ApiError
from prefixgate.local_engine.server.tool_calls import parse_tool_calls
from prefixgate.local_engine.server.tool_mask import ToolConstraint, resolve_tool_constraint
from tests.tiny_model import real_model_dir

pytest.importorskip("llguidance")

EOS = 2  # SmolLM2's <|im_end|>
MAX_STEPS = 1500


@lru_cache(maxsize=1)
def _tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(real_model_dir()))


NAMES = st.from_regex(r"[a-z][a-z0-9_]{0,11}", fullmatch=True)
LEAVES = st.one_of(
    st.just({"type": "string"}),
    st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(0, 6)),
    st.builds(lambda v: {"type": "string", "enum": v},
              st.lists(st.text("abc xyz\"\\é", min_size=1, max_size=5), min_size=1, max_size=3,
                       unique=True)),
    st.just({"type": "integer"}),
    st.builds(lambda lo: {"type": "integer", "minimum": lo, "maximum": lo + 50},
              st.integers(-100, 100)),
    st.just({"type": "number"}),
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
)


def _object(children: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(NAMES, children, max_size=3).flatmap(
        lambda props: st.lists(st.sampled_from(sorted(props)) if props else st.nothing(),
                               unique=True, max_size=len(props)).map(
            lambda req: {"type": "object", "properties": props, "required": req}))


SCHEMAS = st.recursive(
    LEAVES,
    lambda kids: st.one_of(
        _object(kids),
        st.builds(lambda s: {"type": "array", "items": s, "maxItems": 3}, kids),
    ),
    max_leaves=6,
)
TOOLS = st.dictionaries(NAMES, _object(SCHEMAS), min_size=1, max_size=3).map(
    lambda d: [{"type": "function", "function": {"name": n, "parameters": p}}
               for n, p in d.items()])


def _run(tools: list[dict[str, Any]], constraint: ToolConstraint, seed: int,
         max_string: int = 12, prefix: str = "") -> str:
    """Decode from random logits under the mask until EOS, after forcing ``prefix``'s tokens;
    the text (EOS excluded)."""
    tok = _tokenizer()
    proc = tool_call_processor(tok, tools, constraint, max_string=max_string)
    gen = torch.Generator().manual_seed(seed)
    ids: list[int] = list(tok.encode(prefix, add_special_tokens=False))
    for _ in range(MAX_STEPS):
        logits = proc(ids, torch.randn(49152, generator=gen) * 4)
        nxt = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=gen))
        if nxt == EOS:
            return str(tok.decode(ids))
        ids.append(nxt)
    raise AssertionError("no EOS within the step budget")


def _params(tools: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(t["function"]["parameters"] for t in tools if t["function"]["name"] == name)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tools=TOOLS, data=st.data(), seed=st.integers(0, 2**31))
def test_required_answer_is_always_a_valid_call_of_an_allowed_tool(
        tools: list[dict[str, Any]], data: st.DataObject, seed: int) -> None:
    names = [t["function"]["name"] for t in tools]
    allowed = data.draw(st.lists(st.sampled_from(names), min_size=1, unique=True))
    constraint = ToolConstraint("required", tuple(n for n in names if n in allowed))
    text = _run(tools, constraint, seed)
    parsed = parse_tool_calls(text)
    assert len(parsed.tool_calls) == 1, text
    fn = parsed.tool_calls[0]["function"]
    assert fn["name"] in allowed
    jsonschema.validate(json.loads(fn["arguments"]), _params(tools, fn["name"]))


def test_auto_mode_text_then_a_call_of_an_allowed_tool_only() -> None:
    tools = [{"type": "function", "function": {"name": n, "parameters": {
        "type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}
        for n in ("search", "delete_all")]
    for seed in range(3):  # free text never ends on noise: the text part is forced here
        text = _run(tools, ToolConstraint("auto", ("search",)), seed, prefix="Sure. <tool_call>\n")
        calls = parse_tool_calls(text).tool_calls
        assert [c["function"]["name"] for c in calls] == ["search"], text


def _allowed_after(tools: list[dict[str, Any]], c: ToolConstraint, prefix: str) -> set[int]:
    tok = _tokenizer()
    proc = tool_call_processor(tok, tools, c)
    out = proc(list(tok.encode(prefix, add_special_tokens=False)), torch.zeros(49152))
    return set(torch.isfinite(out).nonzero().flatten().tolist())


def test_none_and_auto_modes_cannot_complete_a_masked_call() -> None:
    tools = [{"type": "function", "function": {"name": n}} for n in ("search", "delete_all")]
    tok = _tokenizer()
    close = {i for i in range(49152) if tok.decode([i]).startswith(">")}
    allowed = _allowed_after(tools, ToolConstraint("none", ()), "Hi <tool_call")
    assert allowed and not (close & allowed)
    allowed = _allowed_after(tools, ToolConstraint("auto", ("search",)),
                             '<tool_call>\n{"name": "')
    texts = {tok.decode([i]) for i in allowed}
    assert texts and all("search".startswith(t) or t.startswith("search") for t in texts)


def test_the_masked_tokens_are_minus_inf_and_the_format_is_forced() -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"unit": {"enum": ["c", "f"]}}, "required": ["unit"]}}}]
    tok = _tokenizer()
    proc = tool_call_processor(tok, tools, ToolConstraint("required", ("get_weather",)))
    out = proc([], torch.zeros(49152))
    allowed = torch.isfinite(out).nonzero().flatten().tolist()
    assert allowed and all("<tool_call>".startswith(tok.decode([i])) for i in allowed)


def test_default_bounds_close_objects_and_cap_strings() -> None:
    schema = call_schema("f", {"type": "object", "properties": {"s": {"type": "string"},
                                                                 "e": {"enum": ["a"]}}})
    args = schema["properties"]["arguments"]
    assert args["additionalProperties"] is False
    assert args["properties"]["s"]["maxLength"] == 1024
    assert "maxLength" not in args["properties"]["e"]


def test_defs_refs_resolve_from_the_call_root() -> None:
    params = {"type": "object", "properties": {"p": {"$ref": "#/$defs/P"}}, "required": ["p"],
              "$defs": {"P": {"type": "object", "properties": {"x": {"type": "integer"}},
                              "required": ["x"]}}}
    tools = [{"type": "function", "function": {"name": "f", "parameters": params}}]
    text = _run(tools, ToolConstraint("required", ("f",)), 7)
    call = parse_tool_calls(text).tool_calls[0]["function"]
    jsonschema.validate(json.loads(call["arguments"]), params)


def test_grammar_lists_only_allowed_tools() -> None:
    tools = [{"type": "function", "function": {"name": n}} for n in ("a", "b", "c")]
    lark = tool_call_grammar(tools, ToolConstraint("required", ("a", "c")))
    assert '"const": "a"' in lark and '"const": "c"' in lark and '"const": "b"' not in lark


@pytest.mark.parametrize("choice, expected", [
    (None, None),
    ("auto", None),
    ("none", ToolConstraint("none", ())),
    ("required", ToolConstraint("required", ("a", "b"))),
    ({"type": "function", "function": {"name": "b"}}, ToolConstraint("required", ("b",))),
    ({"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [
        {"type": "function", "function": {"name": "b"}}]}}, ToolConstraint("auto", ("b",))),
    ({"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [
        {"type": "function", "name": "a"}]}}, ToolConstraint("required", ("a",))),
])
def test_tool_choice_shapes(choice: Any, expected: ToolConstraint | None) -> None:
    tools = [{"type": "function", "function": {"name": n}} for n in ("a", "b")]
    assert resolve_tool_constraint(tools, choice) == expected


@pytest.mark.parametrize("tools, choice", [
    (None, "required"),
    ([{"type": "function", "function": {"name": "a"}}], {"type": "function",
                                                          "function": {"name": "zz"}}),
    ([{"type": "function", "function": {"name": "a"}}], {"type": "allowed_tools",
                                                          "allowed_tools": {"tools": []}}),
    ([{"type": "function", "function": {"name": "a"}}], "sometimes"),
])
def test_bad_tool_choice_is_a_400(tools: Any, choice: Any) -> None:
    with pytest.raises(ApiError) as err:
        resolve_tool_constraint(tools, choice)
    assert err.value.status == 400 and err.value.param == "tool_choice"
