"""How deep a JSON value nests, and the error that names where (issue 8, HTTP hygiene).

Every step that walks a body (passes, bridges, the cache analysis, orjson's re-serialisation,
which fails at 255 levels) recurses per level: the proxy bounds depth once, before any of them
(:func:`prefixgate.proxy.http.body.check_nesting`), and the bridges bound JSON they parse out of strings
(:func:`check_nested_text`). The walk is iterative (no Python recursion), linear in the number of
values.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from prefixgate.proxy.core.errors import NestingTooDeep, quoted

_PATH_SHOWN = 8  # path components quoted in the error message (the rest is elided)
DEFAULT_MAX_JSON_DEPTH = 128  # policy limits.max_json_depth's default (prefixgate/config/schema.py)
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def _children(value: dict[str, Any] | list[Any]) -> Iterator[tuple[str | int, Any]]:
    return iter(value.items()) if isinstance(value, dict) else enumerate(value)


def deeper_than(value: Any, max_depth: int) -> bool:
    """Whether an array / object in ``value`` nests deeper than ``max_depth`` levels (the
    top-level value is level 1): the yes / no of :func:`first_too_deep`, level by level.

    Each level's containers come from one list comprehension per container (the scalars are
    skipped at C speed), so a body that stays within the limit — every request but a hostile
    one — is walked at about three times the speed of the path-keeping walk; only a body that
    does not needs :func:`first_too_deep` for where (issue 25: the walk was the largest single
    step of a 29 KB agent body on the event loop)."""
    if not isinstance(value, (dict, list)):
        return False
    if max_depth < 1:
        return True
    level: list[Any] = [value]
    depth = 1
    while level:
        below: list[Any] = []
        for v in level:
            below += [c for c in (v.values() if isinstance(v, dict) else v)
                      if isinstance(c, (dict, list))]
        if below and depth + 1 > max_depth:
            return True
        level, depth = below, depth + 1
    return False


def first_too_deep(value: Any, max_depth: int) -> list[str | int] | None:
    """The JSON path of the first array / object nested deeper than ``max_depth`` levels (the
    top-level value is level 1), or None when ``value`` stays within it.

    Depth-first with an explicit stack of iterators: no recursion, each value visited once.
    """
    if not isinstance(value, (dict, list)):
        return None
    if max_depth < 1:
        return []
    stack = [_children(value)]
    path: list[str | int] = []
    while stack:
        for key, child in stack[-1]:
            if isinstance(child, (dict, list)):
                path.append(key)
                if len(stack) + 1 > max_depth:
                    return path
                stack.append(_children(child))
                break
        else:
            stack.pop()
            if path:
                path.pop()
    return None


def format_path(path: list[str | int]) -> str:
    """``["messages", 0, "content"]`` -> ``messages[0].content``: a param name. Only the first
    few components of a long path are named (see :func:`describe_path`)."""
    out = ""
    for part in path[:_PATH_SHOWN]:
        out += f"[{part}]" if isinstance(part, int) else ("." if out else "") + str(part)
    return out


def describe_path(path: list[str | int], root: str = "<body>") -> tuple[str, str]:
    """``(name, where)`` for an error: ``name`` = :func:`format_path` (``root`` for the empty
    path), the param; ``where`` = ``'name'`` quoted, plus ``, N levels below it`` when the path
    was longer than the part named (a quoted name stays a plain param name)."""
    name = format_path(path) or root
    more = len(path) - _PATH_SHOWN
    return name, quoted(name) + (f", {more} levels below it" if more > 0 else "")


def text_nesting(text: str) -> int:
    """How deep the arrays / objects of JSON-like ``text`` nest (0 for none): string literals
    are skipped, then the brackets counted. Linear; meant for text a JSON parser refused, to
    tell "too deep" from "not JSON" (orjson stops at 1024 levels)."""
    depth = deepest = 0
    for c in _NOT_BRACKET.sub("", _JSON_STRING.sub("", text)):
        depth = depth + 1 if c in "[{" else max(depth - 1, 0)
        deepest = max(deepest, depth)
    return deepest


def check_nested_text(value: Any, text: str, max_depth: int, param: str) -> None:
    """Raise NestingTooDeep (400, ``param``) when JSON parsed out of a string field nests
    deeper than ``max_depth`` (policy ``limits.max_json_depth``): the same bound as the body's,
    applied to what a bridge parses (a tool call's ``arguments``), so the translated body stays
    within it. ``value``: the parsed value, or None when the parser refused ``text`` (then
    ``text`` itself is measured)."""
    if value is None:
        too_deep = text_nesting(text) > max_depth
        where = ""
    else:
        path = first_too_deep(value, max_depth)
        too_deep, where = path is not None, describe_path(path or [], "")[1]
    if too_deep:
        at = f" (at {where})" if where not in ("", "''") else ""
        raise NestingTooDeep(f"{quoted(param)} holds JSON nested more than {max_depth} levels "
                             f"deep{at}; the proxy's limit is {max_depth} (policy "
                             "limits.max_json_depth).", param=param)
