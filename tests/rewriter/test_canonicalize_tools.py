"""canonicalize_tools: same tool set -> same bytes, nothing but order changes (case B04)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixgate.rewriter.passes import canonicalize_tools
from prefixgate.rewriter.passes.canonicalize_tools import (
    canonical_schema,
    canonical_tool,
    form_digest,
    key_order,
    with_key_order,
)
from prefixgate.rewriter.pipeline import rewrite_request
from prefixgate.rewriter.wire import codec as wire
from prefixgate.rewriter.wire.ir import Tool, tool_choice_name
from tests.rewriter.helpers import ctx
from tests.rewriter.strategies import anthropic_requests, openai_requests
from tests.trace_requests import DATA

B04_TOOLS = [
    {"type": "function", "function": {"name": "fs_read_tree",
                                      "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {"name": "gh_search", "parameters": {
        "type": "object", "properties": {"q": {"type": "string"}}}}},
]


def _b04(tools: list[dict[str, Any]]) -> dict[str, Any]:
    return {"model": "m", "tools": tools, "messages": [{"role": "user", "content": "list repo"}]}


def _by_name(tools: list[dict[str, Any]]) -> dict[str, Any]:
    return {(t.get("function") or t)["name"]: t for t in tools}


NAME = {"tool_order": "name"}
"""The stateless mode (sorted by name, canonical keys on every request)."""


def test_swapped_tool_order_gives_identical_tools_bytes_b04() -> None:
    a = rewrite_request(_b04(B04_TOOLS), "openai", ctx(**NAME)).body
    b = rewrite_request(_b04(B04_TOOLS[::-1]), "openai", ctx(**NAME)).body
    assert json.dumps(a["tools"]) == json.dumps(b["tools"])
    assert [t["function"]["name"] for t in a["tools"]] == ["fs_read_tree", "gh_search"]


def test_reordering_is_logged_and_switchable_off() -> None:
    r = rewrite_request(_b04(B04_TOOLS[::-1]), "openai", ctx(**NAME))
    assert "canonicalize_tools" in r.summary()
    assert any(e.pass_name == "canonicalize_tools" and "moved 2" in e.detail for e in r.edits)
    off = rewrite_request(_b04(B04_TOOLS[::-1]), "openai", ctx(canonicalize_tools=False, **NAME))
    assert off.body["tools"] == B04_TOOLS[::-1]


def test_real_mcp_catalog_in_any_order_serializes_identically() -> None:
    tools = json.loads((DATA / "tools" / "github_mcp_server.json").read_text())
    tools = [{"name": t["name"], "description": t.get("description", ""),
              "input_schema": t["inputSchema"]} for t in tools]
    body = {"model": "claude-x", "max_tokens": 8, "tools": tools,
            "messages": [{"role": "user", "content": "hi"}]}
    shuffled = dict(body, tools=tools[::-1][50:] + tools[::-1][:50])
    a = rewrite_request(body, "anthropic", ctx(**NAME)).body
    b = rewrite_request(shuffled, "anthropic", ctx(**NAME)).body
    assert json.dumps(a["tools"]) == json.dumps(b["tools"])
    assert _by_name(a["tools"]) == _by_name(tools)  # names, descriptions, schemas: same values


@settings(max_examples=40, deadline=None)
@given(openai_requests(), st.randoms(use_true_random=False))
def test_any_permutation_of_tools_gives_same_bytes_and_same_content(body: dict[str, Any],
                                                                    rnd: Any) -> None:
    tools = list(body["tools"])
    rnd.shuffle(tools)
    a = rewrite_request(body, "openai", ctx(**NAME)).body
    b = rewrite_request(dict(body, tools=tools), "openai", ctx(**NAME)).body
    assert json.dumps(a["tools"]) == json.dumps(b["tools"])
    assert _by_name(a["tools"]) == _by_name(body["tools"])


@settings(max_examples=30, deadline=None)
@given(anthropic_requests())
def test_tool_choice_still_resolves_after_canonicalization(body: dict[str, Any]) -> None:
    body = dict(body, tool_choice={"type": "tool", "name": body["tools"][-1]["name"]})
    out = wire.parse(rewrite_request(body, "anthropic", ctx()).body, "anthropic")
    assert tool_choice_name(out) in {t.name for t in out.tools or ()}


def test_schema_keywords_sorted_but_argument_order_kept_by_default() -> None:
    schema = {"type": "object", "required": ["b", "a"],
              "properties": {"b": {"type": "string", "description": "B"}, "a": {"type": "int"}}}
    out = canonicalize_tools.canonical_schema(schema)
    assert list(out) == ["properties", "required", "type"]
    assert list(out["properties"]) == ["b", "a"]  # the author's argument order
    assert list(out["properties"]["b"]) == ["description", "type"]
    assert out["required"] == ["b", "a"]  # arrays keep their order
    full = canonicalize_tools.canonical_schema(schema, sort_properties=True)
    assert list(full["properties"]) == ["a", "b"]
    assert json.loads(json.dumps(full)) == schema


def test_first_seen_order_is_kept_per_session_and_remembered() -> None:
    body = _b04(B04_TOOLS[::-1])
    first = rewrite_request(body, "openai", ctx())
    assert first.body is body  # a session's first request goes out as sent
    mem = next(e.memory for e in first.edits if e.memory.get("tool_order"))
    assert mem["tool_order"] == ["gh_search", "fs_read_tree"]  # the client's order, not by name
    again = rewrite_request(_b04(B04_TOOLS), "openai", ctx(session=mem))
    assert [t["function"]["name"] for t in again.body["tools"]] == ["gh_search", "fs_read_tree"]
    assert json.dumps(again.body["tools"]) == json.dumps(body["tools"])
    assert any(e.applied and "moved 2 of 2" in e.detail for e in again.edits)


def _rekeyed(tool: dict[str, Any]) -> dict[str, Any]:
    """The same tool with every object's keys in reverse order (values untouched), except the
    members of ``properties`` (the argument order, content the model reads)."""
    def rev(v: Any, names: bool = False) -> Any:
        if isinstance(v, dict):
            keys = list(v) if names else list(reversed(list(v)))
            return {k: rev(v[k], k == "properties" and not names) for k in keys}
        return [rev(x) for x in v] if isinstance(v, list) else v
    return rev(tool)  # type: ignore[no-any-return]


def test_a_first_request_keeps_the_clients_key_order_and_later_ones_get_it_back() -> None:
    tools = json.loads((DATA / "tools" / "github_mcp_server.json").read_text())[:6]
    tools = [{"type": "function", "function": {"name": t["name"], "description": t.get("description", ""),
                                               "parameters": t["inputSchema"]}} for t in tools]
    body = {"model": "m", "tools": tools, "messages": [{"role": "user", "content": "hi"}]}
    first = rewrite_request(body, "openai", ctx())
    assert first.body is body and "canonicalize_tools" not in first.summary()
    mem = {k: v for e in first.edits for k, v in e.memory.items()}
    shuffled = [_rekeyed(t) for t in tools[3:]] + tools[:3]
    later = rewrite_request(dict(body, tools=shuffled), "openai", ctx(session=mem))
    assert json.dumps(later.body["tools"]) == json.dumps(tools)  # byte-identical to turn 1
    assert any(e.applied and "moved 6 of 6" in e.detail and "re-keyed 3" in e.detail for e in later.edits)


def test_a_tool_whose_values_changed_is_sent_as_sent_and_its_new_form_remembered() -> None:
    mem = {k: v for e in rewrite_request(_b04(B04_TOOLS), "openai", ctx()).edits for k, v in e.memory.items()}
    changed = json.loads(json.dumps(B04_TOOLS))
    changed[1]["function"]["parameters"]["properties"]["q"]["description"] = "query"
    changed[1] = _rekeyed(changed[1])
    out = rewrite_request(_b04(changed), "openai", ctx(session=mem))
    assert json.dumps(out.body["tools"]) == json.dumps(changed)
    forms = {k: v for e in out.edits for k, v in e.memory.items()}["tool_forms"]
    assert forms["gh_search"] != mem["tool_forms"]["gh_search"]
    assert forms["fs_read_tree"] == mem["tool_forms"]["fs_read_tree"]


def test_key_order_round_trip_restores_any_key_order() -> None:
    v = {"b": {"y": [1, {"q": 1, "p": 2}], "x": 0}, "a": None}
    w = {"a": None, "b": {"x": 0, "y": [1, {"p": 2, "q": 1}]}}
    code = canonicalize_tools.key_order(v)
    assert json.dumps(canonicalize_tools.with_key_order(w, code)) == json.dumps(v)
    assert canonicalize_tools.key_order(w) == ""  # all sorted: nothing to remember
    assert json.dumps(canonicalize_tools.with_key_order(v, "")) == json.dumps(w)  # "" = sorted
    assert json.dumps(canonicalize_tools.with_key_order(v, "0/1/2/3/4")) == json.dumps(v)  # no fit: as is
    assert json.dumps(canonicalize_tools.with_key_order(v, "Z")) == json.dumps(v)


_JSON = st.recursive(st.none() | st.integers() | st.text(max_size=3),
                     lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=3), inner, max_size=70), max_leaves=120)


@settings(max_examples=150, deadline=None)
@given(_JSON, st.randoms(use_true_random=False))
def test_key_order_restores_the_order_of_any_json_value_from_any_other_order(v: Any, rnd: Any) -> None:
    def shuffled(x: Any) -> Any:
        if isinstance(x, dict):
            keys = list(x)
            rnd.shuffle(keys)
            return {k: shuffled(x[k]) for k in keys}
        return [shuffled(y) for y in x] if isinstance(x, list) else x
    code = canonicalize_tools.key_order(v)
    assert json.dumps(canonicalize_tools.with_key_order(shuffled(v), code)) == json.dumps(v)


def test_a_117_tool_catalogs_forms_fit_the_session_budget_and_come_back_byte_identical() -> None:
    """The whole GitHub MCP catalog: its remembered forms survive the store's per-session budget
    (the key-name skeletons did not: ~890 KB against 64 KiB, so only the order came back)."""
    from prefixgate.cache.state.session import MemorySessionStore
    raw = json.loads((DATA / "tools" / "github_mcp_server.json").read_text())
    tools = [{"type": "function", "function": {"name": t["name"], "description": t.get("description", ""),
                                               "parameters": t["inputSchema"]}} for t in raw]
    assert len(tools) > 100
    body = {"model": "m", "tools": tools, "messages": [{"role": "user", "content": "hi"}]}
    store = MemorySessionStore()
    first = rewrite_request(body, "openai", ctx())
    store.merge("s", {k: v for e in first.edits for k, v in e.memory.items()})
    assert set(store.get("s")) >= {"tool_order", "tool_forms"}
    later = rewrite_request(dict(body, tools=[_rekeyed(t) for t in tools[::-1]]), "openai",
                            ctx(session=dict(store.get("s"))))
    assert json.dumps(later.body["tools"]) == json.dumps(tools)


def test_client_cache_marker_on_tools_stays_at_the_same_position() -> None:
    tools = [{"name": "zeta", "input_schema": {"type": "object"}},
             {"name": "alpha", "input_schema": {"type": "object"},
              "cache_control": {"type": "ephemeral"}}]
    body = {"model": "claude-x", "max_tokens": 8, "tools": tools,
            "messages": [{"role": "user", "content": "hi"}]}
    out = rewrite_request(body, "anthropic", ctx(**NAME)).body["tools"]
    assert [t["name"] for t in out] == ["alpha", "zeta"]
    assert "cache_control" not in out[0] and out[1]["cache_control"] == {"type": "ephemeral"}


def test_memory_is_proposed_only_when_the_sessions_forms_change() -> None:
    first = rewrite_request(_b04(B04_TOOLS), "openai", ctx())
    mem = {k: v for e in first.edits if e.pass_name == "canonicalize_tools" for k, v in e.memory.items()}
    assert set(mem) == {"tool_order", "tool_forms"}
    again = rewrite_request(_b04(B04_TOOLS), "openai", ctx(session=mem))
    assert all(not e.memory for e in again.edits if e.pass_name == "canonicalize_tools")
    grown = rewrite_request(_b04([*B04_TOOLS, {"type": "function", "function": {"name": "z"}}]),
                            "openai", ctx(session=mem))
    new = {k: v for e in grown.edits if e.pass_name == "canonicalize_tools" for k, v in e.memory.items()}
    assert new["tool_order"] == ["fs_read_tree", "gh_search", "z"] and "z" in new["tool_forms"]


def _tau_tools() -> list[dict[str, Any]]:
    return json.loads((DATA / "tools" / "tau_bench_airline.json").read_text())


def test_a_real_agents_forms_stay_in_session_memory_and_restore_its_key_order() -> None:
    """The 14 tau-bench tools' forms fit a session's budget in the in-process store, so the
    session keeps them: the next turn proposes no memory and a re-keyed turn gets turn 1's
    bytes back (issue 25: the forms as lists of lists took ~73 KB and were dropped on every
    merge, re-learned on every request)."""
    from prefixgate.cache.state.session import MemorySessionStore

    tools = _tau_tools()
    store = MemorySessionStore()
    body = {"model": "m", "tools": tools, "messages": [{"role": "user", "content": "hi"}]}
    first = rewrite_request(body, "openai", ctx())
    store.merge("s", {k: v for e in first.edits for k, v in e.memory.items()})
    assert set(store.get("s")) >= {"tool_order", "tool_forms"}  # not dropped to fit
    again = rewrite_request(body, "openai", ctx(session=dict(store.get("s"))))
    assert all(not e.memory for e in again.edits if e.pass_name == "canonicalize_tools")
    rekeyed = rewrite_request(dict(body, tools=[_rekeyed(t) for t in tools]), "openai",
                              ctx(session=dict(store.get("s"))))
    assert json.dumps(rekeyed.body["tools"]) == json.dumps(tools)


def test_forms_kept_by_an_earlier_version_as_lists_are_relearned_not_misread() -> None:
    """An entry in the old ``[digest, skeleton]`` shape is not a form this version reads: the tool
    goes out as sent and its form is remembered anew (as ``digest + key_order``)."""
    first = rewrite_request(_b04(B04_TOOLS), "openai", ctx())
    mem = {k: v for e in first.edits for k, v in e.memory.items()}
    mem["tool_forms"] = {n: [f[:24], ["d", []]] for n, f in mem["tool_forms"].items()}
    rekeyed = [_rekeyed(t) for t in B04_TOOLS]
    later = rewrite_request(_b04(rekeyed), "openai", ctx(session=mem))
    assert json.dumps(later.body["tools"]) == json.dumps(rekeyed)
    forms = {k: v for e in later.edits for k, v in e.memory.items()}["tool_forms"]
    assert all(isinstance(f, str) for f in forms.values())


# --- the forms at their edges (issue 38: the tests vary what a rule is about) ------------------
# The dimensions varied: the wrapper's keys (the fixed ones, extra ones before and after
# ``cache_control`` in sorted order, a nested dict that is no schema), the tool shapes (Anthropic,
# OpenAI ``function``, ``custom``), ``tool_schema_sort_properties`` on and off (stateless,
# first-seen and the form digest), and the size of an object whose key order is recorded (under,
# at and past the 62 keys a one-digit-per-key token holds; a token ending in a digit that is also
# a letter).

SCHEMA = {"type": "object", "required": ["b"], "properties": {"b": {"type": "string"}, "a": {"type": "integer"}},
          "additionalProperties": False}
SORTED_SCHEMA_KEYS = ["additionalProperties", "properties", "required", "type"]


def test_the_wrapper_keys_take_their_fixed_order_extra_keys_sorted_and_cache_control_last() -> None:
    raw = {"zeta": 1, "cache_control": {"ttl": "1h", "type": "ephemeral"}, "input_schema": SCHEMA,
           "alpha": {"z": 1, "a": 2}, "description": "d", "name": "t"}
    out = canonical_tool(Tool(raw)).raw
    assert list(out) == ["name", "description", "input_schema", "alpha", "zeta", "cache_control"]
    assert out == raw                                            # values untouched
    assert list(out["cache_control"]) == ["ttl", "type"]         # a dict that is no schema: as sent
    assert list(out["alpha"]) == ["z", "a"]
    assert list(out["input_schema"]) == SORTED_SCHEMA_KEYS       # the schema: keys sorted
    assert list(out["input_schema"]["properties"]) == ["b", "a"]  # the argument order kept


@pytest.mark.parametrize("kind, body_keys", [
    ("function", ["name", "description", "parameters", "strict"]),
    ("custom", ["name", "description", "format"]),
])
def test_the_inner_object_of_a_function_or_custom_tool_gets_the_wrapper_order(
        kind: str, body_keys: list[str]) -> None:
    inner: dict[str, Any] = {"format": {"z": 1, "a": 2}} if kind == "custom" else {
        "strict": True, "parameters": SCHEMA}
    inner.update({"description": "d", "name": "t"})
    out = canonical_tool(Tool({kind: inner, "type": kind})).raw
    assert list(out) == ["type", kind] and list(out[kind]) == body_keys
    if kind == "function":
        assert list(out[kind]["parameters"]) == SORTED_SCHEMA_KEYS
    else:
        assert list(out[kind]["format"]) == ["z", "a"]           # no schema: as sent


@pytest.mark.parametrize("sort_properties, props", [(False, ["b", "a"]), (True, ["a", "b"])])
def test_sorting_the_properties_is_a_switch(sort_properties: bool, props: list[str]) -> None:
    tool = Tool({"name": "t", "input_schema": SCHEMA})
    assert list(canonical_tool(tool, sort_properties).raw["input_schema"]["properties"]) == props
    if not sort_properties:
        assert list(canonical_tool(tool).raw["input_schema"]["properties"]) == props   # the default
    body = {"model": "m", "messages": [{"role": "user", "content": "go"}],
            "tools": [{"type": "function", "function": {"name": "t", "parameters": SCHEMA}}]}
    sent = rewrite_request(body, "openai", ctx(tool_order="name",
                                               tool_schema_sort_properties=sort_properties)).body
    assert list(sent["tools"][0]["function"]["parameters"]["properties"]) == props


def test_the_form_digest_ignores_the_property_order_only_when_properties_are_sorted() -> None:
    swapped = {**SCHEMA, "properties": {"a": SCHEMA["properties"]["a"], "b": SCHEMA["properties"]["b"]}}
    one = Tool({"name": "t", "input_schema": SCHEMA, "cache_control": {"type": "ephemeral"}})
    two = Tool({"name": "t", "input_schema": swapped})
    assert form_digest(one, True) == form_digest(two, True)
    assert form_digest(one, False) != form_digest(two, False)
    assert form_digest(one, False) == form_digest(Tool({"name": "t", "input_schema": SCHEMA}), False)


def test_with_sorted_properties_a_session_gets_its_first_seen_property_order_back() -> None:
    """First-seen mode, properties sorted for the digest: the same tool with its arguments in
    another order is the same form, so it goes out in the order the session first saw."""
    def body(props: dict[str, Any]) -> dict[str, Any]:
        return {"model": "m", "messages": [{"role": "user", "content": "go"}],
                "tools": [{"type": "function", "function": {"name": "t", "parameters": {
                    "type": "object", "properties": props}}}]}
    a, b = {"type": "integer"}, {"type": "string"}
    first = rewrite_request(body({"b": b, "a": a}), "openai", ctx(tool_schema_sort_properties=True))
    memory = {k: v for e in first.edits for k, v in e.memory.items()}
    later = rewrite_request(body({"a": a, "b": b}), "openai",
                            ctx(session=memory, tool_schema_sort_properties=True)).body
    assert list(later["tools"][0]["function"]["parameters"]["properties"]) == ["b", "a"]


def _keys(n: int) -> list[str]:
    return [f"k{i:03d}" for i in range(n)]


@pytest.mark.parametrize("n, star", [(34, False), (61, False), (62, False), (63, True), (70, True)])
@pytest.mark.parametrize("order", ["reversed", "first_two_swapped"])
def test_key_orders_of_large_objects_round_trip(n: int, star: bool, order: str) -> None:
    """Up to 62 keys a token is one base-62 digit per key; past it ``*`` and decimals. Swapping
    the first two of 34 keys ends the token in ``X`` (digit 33), a letter next to the ``/`` the
    code strips."""
    keys = _keys(n)
    keys = keys[::-1] if order == "reversed" else [keys[1], keys[0], *keys[2:]]
    v = {"outer": {k: i for i, k in enumerate(keys)}, "a_inner": {"b": 1, "a": 2}}
    code = key_order(v)                       # root, then a_inner, then outer: outer's token last
    assert code.count("*") == int(star)
    if n == 34 and order == "first_two_swapped":
        assert code.endswith("X")
    back = with_key_order({k: dict(sorted(x.items())) for k, x in sorted(v.items())}, code)
    assert back == v and list(back) == ["outer", "a_inner"]
    assert list(back["outer"]) == keys and list(back["a_inner"]) == ["b", "a"]


def test_a_prompt_without_tools_says_so_under_the_passes_name() -> None:
    r = rewrite_request({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, "openai", ctx())
    edit = next(e for e in r.edits if e.pass_name == "canonicalize_tools")
    assert (edit.applied, edit.region, edit.detail) == (False, "tools", "no tools")


def test_a_tool_without_a_name_leaves_the_order_as_sent_and_says_why() -> None:
    tools = [{"name": "b", "input_schema": {"type": "object"}}, {"input_schema": {"type": "object"}}]
    body = {"model": "claude-x", "max_tokens": 8, "tools": tools, "messages": [{"role": "user", "content": "hi"}]}
    r = rewrite_request(body, "anthropic", ctx(tool_order="name"))
    edit = next(e for e in r.edits if e.pass_name == "canonicalize_tools")
    assert (edit.applied, edit.region, edit.detail) == (False, "tools", "a tool has no name: order left as sent")
    assert r.body["tools"] == tools


def _edit(r: Any) -> Any:
    return next(e for e in r.edits if e.pass_name == "canonicalize_tools")


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_a_moved_tool_set_reports_its_move_its_tokens_and_keeps_the_rest_of_the_body(api: str) -> None:
    """Tokens counted on the tools as sent (non-ASCII text unescaped), the move and the re-keyed
    schemas in the detail, and everything but the tools as the client sent it."""
    def tool(name: str, desc: str) -> dict[str, Any]:
        schema = {"type": "object", "properties": {"q": {"type": "string"}}}
        if api == "openai":
            return {"type": "function", "function": {"name": name, "description": desc, "parameters": schema}}
        return {"input_schema": schema, "name": name, "description": desc}   # keys out of wrapper order
    tools = [tool("zeta", "größe 文字 " * 5), tool("alpha", "ünïcode")]
    body: dict[str, Any] = {"model": "m", "max_tokens": 8, "system": "sys", "tools": tools,
                            "messages": [{"role": "user", "content": "hi"}]}
    if api == "openai":
        body["messages"] = [{"role": "system", "content": "sys"}, *body["messages"]]
        del body["system"], body["max_tokens"]
    r = rewrite_request(body, api, ctx(tool_order="name"))
    edit = _edit(r)
    sent = r.body["tools"]
    want = json.dumps(sent, ensure_ascii=False)
    assert (edit.applied, edit.region) == (True, "tools")
    assert edit.detail == "order=name; moved 2 of 2 tools; re-keyed 2 schemas"   # schema keys sorted
    n = ctx().count_tokens(want)
    assert n != ctx().count_tokens(json.dumps(sent))           # the escapes would count otherwise
    assert (edit.tokens_before, edit.tokens_after, edit.tokens_reusable) == (n, n, n)
    assert edit.memory == {}
    assert {k: v for k, v in r.body.items() if k != "tools"} == {k: v for k, v in body.items() if k != "tools"}


def test_a_tool_set_already_in_its_form_is_left_alone_and_says_so() -> None:
    body = rewrite_request(_b04(B04_TOOLS[::-1]), "openai", ctx(**NAME)).body   # once: its form
    r = rewrite_request(body, "openai", ctx(**NAME))
    edit = _edit(r)
    assert (edit.applied, edit.region, edit.detail) == (False, "tools", "tools already in their form")
    assert r.body == body and edit.memory == {}


def test_a_new_tool_in_a_moved_set_is_remembered_in_the_applied_edit() -> None:
    first = rewrite_request(_b04(B04_TOOLS), "openai", ctx())
    memory = {k: v for e in first.edits for k, v in e.memory.items()}
    new = {"type": "function", "function": {"name": "aa_new", "parameters": {"type": "object"}}}
    r = rewrite_request(_b04([new, *B04_TOOLS[::-1]]), "openai", ctx(session=memory))
    edit = _edit(r)
    assert edit.applied and [t["function"]["name"] for t in r.body["tools"]] == [
        "fs_read_tree", "gh_search", "aa_new"]
    assert edit.memory["tool_order"] == ["fs_read_tree", "gh_search", "aa_new"]
    assert set(edit.memory["tool_forms"]) == {"fs_read_tree", "gh_search", "aa_new"}


def test_sorted_properties_reach_the_schemas_inside_arrays() -> None:
    inner = {"type": "object", "properties": {"b": {"type": "string"}, "a": {"type": "string"}}}
    schema = {"anyOf": [inner, {"type": "null"}]}
    got = canonical_schema(schema, sort_properties=True)
    assert list(got["anyOf"][0]["properties"]) == ["a", "b"]
    assert list(canonical_schema(schema)["anyOf"][0]["properties"]) == ["b", "a"]


@pytest.mark.parametrize("messages", ["hi", [{"role": "user", "content": "hi"}, "loose"]])
def test_messages_the_rewriter_cannot_model_stay_as_sent_when_the_tools_move(messages: Any) -> None:
    body = {"model": "m", "tools": B04_TOOLS[::-1], "messages": messages}
    r = rewrite_request(body, "openai", ctx(**NAME))
    assert _edit(r).applied and r.body["messages"] == messages
