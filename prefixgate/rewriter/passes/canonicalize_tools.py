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
  (``ctx.session["tool_forms"]``: ``{name: digest + key_order}``, no keys, no values); a
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
from collections.abc import Iterator
from typing import Any

from prefixgate.rewriter.region_memo import TailFree
from prefixgate.rewriter.types import Context, Edit
from prefixgate.rewriter.wire.ir import Prompt, Tool, with_key, without_key

NAME = "canonicalize_tools"
_NAME_MAP_KEYS = frozenset({"properties", "patternProperties"})
_WRAPPER_FIRST = ("type", "function", "custom", "name", "description", "parameters",
                  "input_schema", "inputSchema", "strict")
_SCHEMA_KEYS = ("parameters", "input_schema", "inputSchema")
_DIGEST_CHARS = 24
"""Hex characters of a tool's canonical-form digest at the head of its ``tool_forms`` entry."""
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


_PERM_DIGITS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def _dicts_in_sorted_order(v: Any) -> Iterator[dict[str, Any]]:
    """Every object in ``v``, depth first, children visited in *sorted* key order (so the walk
    depends on the values only, not on the order their keys arrived in)."""
    if isinstance(v, dict):
        yield v
        for k in sorted(v):
            yield from _dicts_in_sorted_order(v[k])
    elif isinstance(v, list):
        for x in v:
            yield from _dicts_in_sorted_order(x)


def _perm_token(keys: list[str]) -> str:
    """The permutation taking ``sorted(keys)`` to ``keys``: ``""`` when already sorted, one
    base-62 digit per key up to 62 keys, else ``*`` and comma-separated decimals."""
    rank = {k: i for i, k in enumerate(sorted(keys))}
    perm = [rank[k] for k in keys]
    if perm == sorted(perm):
        return ""
    if len(perm) <= len(_PERM_DIGITS):
        return "".join(_PERM_DIGITS[i] for i in perm)
    return "*" + ",".join(map(str, perm))


def _perm_from_token(token: str, n: int) -> list[int] | None:
    """Inverse of :func:`_perm_token` for an object of ``n`` keys; ``None`` when it does not fit."""
    if token == "":
        return list(range(n))
    try:
        perm = ([int(x) for x in token[1:].split(",")] if token.startswith("*")
                else [_PERM_DIGITS.index(c) for c in token])
    except ValueError:
        return None
    return perm if sorted(perm) == list(range(n)) else None


def key_order(v: Any) -> str:
    """The key order of a JSON value as a compact string, without keys or values: one token per
    object (depth first, children in sorted key order) naming the permutation of its sorted keys,
    ``/``-separated, trailing sorted objects left out. ~3 bytes per object of a tool schema, so a
    117-tool catalog's forms fit a session's memory budget (the key names themselves did not)."""
    return "/".join(_perm_token(list(d)) for d in _dicts_in_sorted_order(v)).rstrip("/")


def with_key_order(v: Any, code: str) -> Any:
    """``v`` with the key order :func:`key_order` recorded; ``v`` as it is when ``code`` does not
    fit its shape (the caller only applies it to a tool whose canonical values are unchanged)."""
    tokens = code.split("/") if code else []
    dicts = list(_dicts_in_sorted_order(v))
    if len(tokens) > len(dicts):
        return v
    perms: dict[int, list[int]] = {}
    for i, d in enumerate(dicts):
        perm = _perm_from_token(tokens[i] if i < len(tokens) else "", len(d))
        if perm is None:
            return v
        perms[id(d)] = perm

    def rebuild(x: Any) -> Any:
        if isinstance(x, dict):
            keys = sorted(x)
            return {keys[i]: rebuild(x[keys[i]]) for i in perms[id(x)]}
        if isinstance(x, list):
            return [rebuild(y) for y in x]
        return x
    return rebuild(v)


def form_digest(tool: Tool, sort_properties: bool) -> str:
    """Digest of the tool's canonical form: equal iff the same values (key order aside)."""
    text = _dump(canonical_tool(Tool(without_key(tool.raw, "cache_control")), sort_properties).raw)
    return hashlib.blake2b(text.encode(), digest_size=_DIGEST_CHARS // 2).hexdigest()


def _first_seen_forms(tools: list[Tool], ctx: Context, sort_props: bool
                      ) -> tuple[list[Tool], dict[str, str]]:
    """Each tool in the key order the session first saw it with (same values only), and the
    session's updated ``tool_forms``."""
    forms = ctx.session.get("tool_forms")
    known: dict[str, str] = dict(forms) if isinstance(forms, dict) else {}
    out = []
    for t in tools:
        digest = form_digest(t, sort_props)
        seen = known.get(t.name)
        if isinstance(seen, str) and seen[:_DIGEST_CHARS] == digest:
            out.append(Tool(with_key_order(t.raw, seen[_DIGEST_CHARS:])))
        else:
            known[t.name] = digest + key_order(t.raw)
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
