"""Pass: one byte form per tool set, so tools that did not change keep their cached bytes (case B04).

Rule. Prefix caches are byte-exact (Anthropic: "cache hits require 100% identical prompt
segments, including all text and images up to and including the block marked with cache
control"; OpenAI: exact prefix match), and tools come first in the cached prefix. So two
requests with the same tool set must serialize it identically, whatever order the client
registered its tools in (e.g. MCP servers that finished connecting in a different order).

Two modes (``settings.tool_order``):

* ``"first_seen"`` (the default) — the form the session first saw is the canonical one: a
  session's first request goes out as sent (a model reads tool order and key order, and an
  answer may change with them: ``bench/answer_stability.py``), and a later request whose tools
  are the same *values* in another order or another key order gets the first-seen order and
  each tool's first-seen bytes back. Order: the tools the session knows, in the order it first
  saw them, then new tools in the client's order (``ctx.session["tool_order"]``). Form: per
  tool name, the digest of its canonical form (below) and the key order it was first seen with
  (``ctx.session["tool_forms"]``: ``{name: [digest, skeleton]}``, key names only, no values,
  the skeleton kept as its compact JSON text — one string, not thousands of small lists, so a
  14-tool agent's forms take ~7 KB of session memory instead of ~73 KB, within a session's
  budget; a skeleton kept as a list by an earlier version is read as well); a
  tool whose canonical digest matches gets that key order back, a tool that changed is sent as
  sent and its new form remembered. Updates go in ``Edit.memory``.
* ``"name"`` — stateless: tools sorted by name (stable; ties keep client order) and each schema
  in the canonical key order below, on every request (identical across sessions and replicas,
  but a first request whose tools were not in that form changes).

Canonical form: inside each tool's JSON schema (``parameters`` / ``input_schema`` /
``inputSchema``), object keys are sorted recursively — except the member order of
``properties`` / ``patternProperties`` (the author's argument order, which the model reads as
the parameter list) unless ``settings.tool_schema_sort_properties``. Arrays (``required``,
``enum``, ``anyOf``...) keep their order: order is content there. The tool wrapper's own keys
get a fixed order (``type, function`` / ``name, description, parameters|input_schema, ...``
then the rest sorted; ``cache_control`` last).

Never changed: names, descriptions, schema values. ``tool_choice`` names a tool by name, so it
still resolves. Client ``cache_control`` markers on tools stay at the same *positions* (the
client meant "cache the first i+1 tools"), never dropped.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from prefixgate.rewriter.ir import Prompt, Tool, with_key, without_key
from prefixgate.rewriter.region_memo import TailFree
from prefixgate.rewriter.types import Context, Edit

NAME = "canonicalize_tools"
_NAME_MAP_KEYS = frozenset({"properties", "patternProperties"})
_WRAPPER_FIRST = ("type", "function", "custom", "name", "description", "parameters",
                  "input_schema", "inputSchema", "strict")
_SCHEMA_KEYS = ("parameters", "input_schema", "inputSchema")
READS = TailFree(settings=("tool_order", "tool_schema_sort_properties"),
                 session=("tool_order", "tool_forms"))
"""Everything :func:`run` reads besides ``prompt.tools`` (and ``ctx.count_tokens``): its
output is a pure function of these, so :mod:`prefixgate.rewriter.region_memo` may keep it.
Keep in step with the code: a new read here must be named here."""


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
    """``(tools in the mode's order, the session's updated first-seen names or None)``."""
    if ctx.settings.tool_order == "name":
        return sorted(tools, key=lambda t: t.name), None
    known = [n for n in ctx.session.get("tool_order", []) if isinstance(n, str)]
    rank = {n: i for i, n in enumerate(known)}
    new_names = list(dict.fromkeys(t.name for t in tools if t.name not in rank))
    rank.update({n: len(known) + i for i, n in enumerate(new_names)})
    return sorted(tools, key=lambda t: rank[t.name]), known + new_names


def skeleton(v: Any) -> Any:
    """The key order of a JSON value, without its values: ``["d", [[key, skeleton], ...]]`` for
    an object, ``["l", [skeleton, ...]]`` for an array, ``0`` for a scalar."""
    if isinstance(v, dict):
        return ["d", [[k, skeleton(x)] for k, x in v.items()]]
    if isinstance(v, list):
        return ["l", [skeleton(x) for x in v]]
    return 0


def with_skeleton(v: Any, sk: Any) -> Any:
    """``v`` with the key order of ``sk`` (:func:`skeleton`); keys ``sk`` does not name follow
    in ``v``'s order; a shape that does not match leaves that part of ``v`` as it is."""
    if isinstance(v, dict) and isinstance(sk, list) and len(sk) == 2 and sk[0] == "d":
        order = {k: child for k, child in sk[1] if isinstance(k, str)}
        keys = [k for k in order if k in v] + [k for k in v if k not in order]
        return {k: with_skeleton(v[k], order.get(k, 0)) for k in keys}
    if isinstance(v, list) and isinstance(sk, list) and len(sk) == 2 and sk[0] == "l":
        return [with_skeleton(x, sk[1][i] if i < len(sk[1]) else 0) for i, x in enumerate(v)]
    return v


def skeleton_text(v: Any) -> str:
    """:func:`skeleton` as compact JSON text (how ``tool_forms`` keeps it)."""
    return json.dumps(skeleton(v), separators=(",", ":"), ensure_ascii=False)


def _skeleton_of(kept: Any) -> Any:
    """A kept skeleton: its JSON text parsed, or an earlier version's list as it is (text that
    does not parse: no shape, the tool as sent)."""
    if not isinstance(kept, str):
        return kept
    try:
        return json.loads(kept)
    except ValueError:
        return 0


def form_digest(tool: Tool, sort_properties: bool) -> str:
    """Digest of the tool's canonical form: equal iff the same values (key order aside)."""
    text = _dump(canonical_tool(Tool(without_key(tool.raw, "cache_control")), sort_properties).raw)
    return hashlib.blake2b(text.encode(), digest_size=12).hexdigest()


def _first_seen_forms(tools: list[Tool], ctx: Context, sort_props: bool
                      ) -> tuple[list[Tool], dict[str, list[Any]]]:
    """Each tool in the key order the session first saw it with (same values only), and the
    session's updated ``tool_forms``."""
    forms = ctx.session.get("tool_forms")
    known: dict[str, list[Any]] = dict(forms) if isinstance(forms, dict) else {}
    out = []
    for t in tools:
        digest = form_digest(t, sort_props)
        seen = known.get(t.name)
        if isinstance(seen, list) and len(seen) == 2 and seen[0] == digest:
            out.append(Tool(with_skeleton(t.raw, _skeleton_of(seen[1]))))
        else:
            known[t.name] = [digest, skeleton_text(t.raw)]
            out.append(t)
    return out, known


def _keep_marker_positions(original: tuple[Tool, ...], ordered: list[Tool]) -> list[Tool]:
    marks = [t.cache_control for t in original]
    if not any(marks):
        return ordered
    out = [Tool(without_key(t.raw, "cache_control")) for t in ordered]
    return [t if marks[i] is None else Tool(with_key(t.raw, "cache_control", marks[i]))
            for i, t in enumerate(out)]


def run(prompt: Prompt, ctx: Context) -> tuple[Prompt, list[Edit]]:
    """Reorder and re-form ``prompt.tools`` by the mode (module docstring); one Edit
    (``region="tools"``)."""
    if not prompt.tools:
        return prompt, [Edit(NAME, False, "tools", "no tools")]
    if any(not t.name for t in prompt.tools):
        return prompt, [Edit(NAME, False, "tools", "a tool has no name: order left as sent")]
    sort_props = bool(getattr(ctx.settings, "tool_schema_sort_properties", False))
    ordered, names = _order(list(prompt.tools), ctx)
    if names is None:
        canon, mem = [canonical_tool(t, sort_props) for t in ordered], {}
    else:
        canon, forms = _first_seen_forms(ordered, ctx, sort_props)
        mem = {k: v for k, v in (("tool_order", names), ("tool_forms", forms))
               if ctx.session.get(k) != v}  # only what changed: memory merges shallowly
    canon = _keep_marker_positions(prompt.tools, canon)
    moved = sum(1 for a, b in zip(prompt.tools, ordered) if a.name != b.name)
    rewritten = sum(1 for a, b in zip(ordered, canon) if _dump(a.raw) != _dump(b.raw))
    if moved == 0 and all(_dump(a.raw) == _dump(b.raw) for a, b in zip(prompt.tools, canon)):
        return prompt, [Edit(NAME, False, "tools", "tools already in their form", memory=mem)]
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
