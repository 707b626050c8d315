"""Nesting limits on the JSON a request's tools carry, checked before anything recursive reads it.

Tool definitions are walked recursively downstream: ``json.dumps`` (the Hermes tools block;
templates' ``tojson``, pure Python with ``indent``), ``copy.deepcopy`` and the schema rewrite in
``constrained.py``, and llguidance, whose embedded JSON parser stops at 128 levels and whose
schema compiler follows ``$ref`` chains on the native stack — a chain of ~1000 nested
definitions overflowed it and killed the process (SIGSEGV), every tenant's streams with it. A
forced tool whose schema nested ``anyOf`` 200 deep was a 500 ``RecursionError`` (issue 20, Low).

Rules (a 400 naming the tool and the limit, ``param`` pointing at it):

- every tool definition nests at most ``MAX_TOOL_DEPTH`` levels (each JSON object or array is
  a level: ``anyOf``, ``oneOf``, ``items``, ``properties`` alike);
- a forced tool's ``parameters`` (``tool_choice`` compiles it into a grammar) with its local
  ``$ref``s followed — each hop a level, a reference back into a definition being expanded
  (recursion, which the grammar handles) adding nothing — reach at most ``MAX_TOOL_DEPTH``.

64 is half the proxy's whole-body limit (``limits.max_json_depth``, 128), beyond any real tool
schema (OpenAI's strict schemas allow 10 levels of object nesting) and far inside every reader's
limit above. The walks here are iterative and stop counting past the limit.
"""

from __future__ import annotations

from typing import Any

from prefixgate.local_engine.server.protocol import ApiError

__all__ = ["MAX_TOOL_DEPTH", "check_tool_depths", "expanded_depth", "json_depth"]

MAX_TOOL_DEPTH = 64


def json_depth(value: Any, stop: int = MAX_TOOL_DEPTH) -> int:
    """Levels of JSON objects / arrays in ``value`` (a scalar is 0, ``{}`` is 1); counting stops
    at ``stop + 1``. Iterative."""
    best = 0
    todo: list[tuple[Any, int]] = [(value, 1)]
    while todo:
        v, d = todo.pop()
        if isinstance(v, dict):
            children = v.values()
        elif isinstance(v, list):
            children = v
        else:
            continue
        best = max(best, d)
        if best > stop:
            return best
        todo.extend((c, d + 1) for c in children)
    return best


def _resolve(root: Any, ref: str) -> Any:
    """The target of a local JSON pointer ``#/a/b`` in ``root`` (RFC 6901 escapes), or None."""
    if not ref.startswith("#"):
        return None
    node = root
    for part in [p for p in ref[1:].split("/") if p]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def expanded_depth(schema: Any, stop: int = MAX_TOOL_DEPTH) -> int:
    """Levels of ``schema`` with its local ``$ref``s followed (a hop is a level; a reference to
    a definition already being expanded on this path adds nothing); stops past ``stop``.
    Iterative; a definition reached again at no greater depth is not walked again."""
    best = 0
    seen: dict[int, int] = {}  # id(definition) -> the greatest depth it was expanded at
    todo: list[tuple[Any, int, frozenset[int]]] = [(schema, 1, frozenset())]
    while todo:
        v, d, path = todo.pop()
        if isinstance(v, dict):
            ref = v.get("$ref")
            if isinstance(ref, str):
                target = _resolve(schema, ref)
                if target is not None and id(target) not in path and seen.get(id(target), 0) < d + 1:
                    seen[id(target)] = d + 1
                    todo.append((target, d + 1, path | {id(target)}))
            children: Any = v.values()
        elif isinstance(v, list):
            children = v
        else:
            continue
        best = max(best, d)
        if best > stop:
            return best
        todo.extend((c, d + 1, path) for c in children if isinstance(c, (dict, list)))
    return best


def _too_deep(name: str, depth: int, param: str, what: str) -> ApiError:
    got = f"more than {MAX_TOOL_DEPTH}" if depth > MAX_TOOL_DEPTH else str(depth)
    return ApiError(f"Tool '{name[:64]}': its {what} nests {got} levels deep; this engine accepts "
                    f"at most {MAX_TOOL_DEPTH} (each JSON object or array is a level).",
                    param=param, code="invalid_value")


def check_tool_depths(tools: list[dict[str, Any]] | None, forced: tuple[str, ...] = ()) -> None:
    """ApiError(400) for the first tool past the rules (module docstring); ``forced``: names
    of the tools a ``tool_choice`` compiles into a grammar."""
    for i, tool in enumerate(tools or []):
        fn = tool.get("function")
        name = (fn.get("name") if isinstance(fn, dict) else tool.get("name")) or f"#{i}"
        name = name if isinstance(name, str) else f"#{i}"
        if json_depth(tool) > MAX_TOOL_DEPTH:
            raise _too_deep(name, json_depth(tool), f"tools[{i}]", "definition")
        if name in forced:
            params = fn.get("parameters") if isinstance(fn, dict) else tool.get("parameters")
            if isinstance(params, dict) and expanded_depth(params) > MAX_TOOL_DEPTH:
                raise _too_deep(name, expanded_depth(params), f"tools[{i}].function.parameters",
                                "parameters schema, $refs followed,")
