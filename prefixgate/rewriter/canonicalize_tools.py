"""Pass: canonical tool order and byte-stable tool schemas (case B04).

Rule. Prefix caches are byte-exact (Anthropic: "cache hits require 100% identical prompt
segments, including all text and images up to and including the block marked with cache
control"; OpenAI: exact prefix match), and tools come first in the cached prefix. So two
requests with the same tool set must serialize it identically, whatever order the client
registered its tools in (e.g. MCP servers that finished connecting in a different order):

* Order: ``tool_order: "name"`` sorts tools by name (stable; ties keep client order).
  ``"first_seen"`` keeps the order in which this session first saw each tool
  (``ctx.session["tool_order"]``; tools new to the session go last, by name); the updated list is
  returned in ``Edit.memory["tool_order"]``.
* Serialization: inside each tool's JSON schema (``parameters`` / ``input_schema`` /
  ``inputSchema``), object keys are sorted recursively — except the member order of
  ``properties`` / ``patternProperties`` (the author's argument order, which the model reads as
  the parameter list) unless ``settings.tool_schema_sort_properties``. Arrays (``required``,
  ``enum``, ``anyOf``...) keep their order: order is content there. The tool wrapper's own keys
  get a fixed order (``type, function`` / ``name, description, parameters|input_schema, ...``
  then the rest sorted; ``cache_control`` last).
* Never changed: names, descriptions, schema values. ``tool_choice`` names a tool by name, so it
  still resolves. Client ``cache_control`` markers on tools stay at the same *positions* (the
  client meant "cache the first i+1 tools"), never dropped.
"""

from __future__ import annotations

import json
from typing import Any

from prefixgate.rewriter.ir import Prompt, Tool, with_key, without_key
from prefixgate.rewriter.types import Context, Edit

NAME = "canonicalize_tools"
_NAME_MAP_KEYS = frozenset({"properties", "patternProperties"})
_WRAPPER_FIRST = ("type", "function", "custom", "name", "description", "parameters",
                  "input_schema", "inputSchema", "strict")
_SCHEMA_KEYS = ("parameters", "input_schema", "inputSchema")


def canonical_schema(v: Any, sort_properties: bool = False, _in_names: bool = False) -> Any:
    """JSON schema with object keys sorted recursively (see module docstring for exceptions)."""
    if isinstance(v, dict):
        keys = list(v) if (_in_names and not sort_properties) else sorted(v)
        return {k: canonical_schema(v[k], sort_properties,
                                    _in_names=(k in _NAME_MAP_KEYS and not _in_names))
                for k in keys}
    if isinstance(v, list):
        return [canonical_schema(x, sort_properties) for x in v]
    return v


def _wrapper_order(d: dict[str, Any]) -> list[str]:
    first = [k for k in _WRAPPER_FIRST if k in d]
    rest = sorted(k for k in d if k not in _WRAPPER_FIRST and k != "cache_control")
    return first + rest + (["cache_control"] if "cache_control" in d else [])


def _canonical_level(d: dict[str, Any], sort_props: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k in _wrapper_order(d):
        v = d[k]
        if k in _SCHEMA_KEYS:
            v = canonical_schema(v, sort_props)
        elif k in ("function", "custom") and isinstance(v, dict):
            v = _canonical_level(v, sort_props)
        out[k] = v
    return out


def canonical_tool(tool: Tool, sort_properties: bool = False) -> Tool:
    """One tool with canonical wrapper key order and a canonical schema (values untouched)."""
    return Tool(_canonical_level(tool.raw, sort_properties))


def _order(tools: list[Tool], ctx: Context) -> tuple[list[Tool], list[str] | None]:
    if ctx.settings.tool_order == "name":
        return sorted(tools, key=lambda t: t.name), None
    known = [n for n in ctx.session.get("tool_order", []) if isinstance(n, str)]
    rank = {n: i for i, n in enumerate(known)}
    new_names = sorted({t.name for t in tools if t.name not in rank})
    memory = known + new_names
    rank.update({n: len(known) + i for i, n in enumerate(new_names)})
    return sorted(tools, key=lambda t: rank[t.name]), memory


def _keep_marker_positions(original: tuple[Tool, ...], ordered: list[Tool]) -> list[Tool]:
    marks = [t.cache_control for t in original]
    if not any(marks):
        return ordered
    out = [Tool(without_key(t.raw, "cache_control")) for t in ordered]
    return [t if marks[i] is None else Tool(with_key(t.raw, "cache_control", marks[i]))
            for i, t in enumerate(out)]


def run(prompt: Prompt, ctx: Context) -> tuple[Prompt, list[Edit]]:
    """Reorder and canonicalize ``prompt.tools``; one Edit (``region="tools"``)."""
    if not prompt.tools:
        return prompt, [Edit(NAME, False, "tools", "no tools")]
    if any(not t.name for t in prompt.tools):
        return prompt, [Edit(NAME, False, "tools", "a tool has no name: order left as sent")]
    sort_props = bool(getattr(ctx.settings, "tool_schema_sort_properties", False))
    ordered, memory = _order(list(prompt.tools), ctx)
    canon = [canonical_tool(t, sort_props) for t in ordered]
    canon = _keep_marker_positions(prompt.tools, canon)
    mem = {"tool_order": memory} if memory is not None else {}
    moved = sum(1 for a, b in zip(prompt.tools, ordered) if a.name != b.name)
    rewritten = sum(1 for a, b in zip(ordered, canon) if _dump(a.raw) != _dump(b.raw))
    if moved == 0 and all(_dump(a.raw) == _dump(b.raw) for a, b in zip(prompt.tools, canon)):
        return prompt, [Edit(NAME, False, "tools", "tools already canonical", memory=mem)]
    tokens = ctx.count_tokens(json.dumps([t.raw for t in canon], ensure_ascii=False))
    detail = f"order={ctx.settings.tool_order}; moved {moved} of {len(canon)} tools; " \
             f"re-keyed {rewritten} schemas"
    return (
        Prompt(prompt.api, tuple(canon), prompt.system, prompt.messages, prompt.params,
               prompt.key_order, prompt.system_present),
        [Edit(NAME, True, "tools", detail, tokens, tokens, memory=mem, tokens_reusable=tokens)],
    )


def _dump(v: Any) -> str:
    """JSON text with key order (equal iff same values *and* same key order)."""
    return json.dumps(v, ensure_ascii=False)
