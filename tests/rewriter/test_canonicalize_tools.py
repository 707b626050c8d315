"""canonicalize_tools: same tool set -> same bytes, nothing but order changes (case B04)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from prefixgate.rewriter.passes import canonicalize_tools
from prefixgate.rewriter.pipeline import rewrite_request
from prefixgate.rewriter.wire import codec as wire
from prefixgate.rewriter.wire.ir import tool_choice_name
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
