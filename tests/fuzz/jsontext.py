"""JSON that keeps every number's exact text, for the fuzzer's bodies and its number invariant.

- :class:`Num` — a number literal kept as its JSON text (``1.10``, ``123456789012345678901234567890``).
  Parsing with :func:`loads` turns every number into a ``Num``; :func:`dumps` writes a ``Num``
  back verbatim, so ``dumps(loads(raw))`` keeps every literal.
- :func:`number_literals` — the multiset of number texts in a parsed document, including the
  numbers inside JSON-encoded strings the caller names (OpenAI ``function.arguments``).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any


class Num(str):
    """A JSON number literal, kept as text (a ``str`` subclass so it hashes and compares by text)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Num({str(self)!r})"


class Raw(str):
    """JSON text written verbatim by :func:`dumps` (deeply nested values built as text, so
    serializing them needs no recursion)."""

    __slots__ = ()


def loads(raw: bytes | str) -> Any:
    """Parse JSON, every number as :class:`Num`. Raises ``ValueError`` on invalid JSON
    (NaN / Infinity included: they are not JSON)."""

    def bad_constant(name: str) -> Any:
        raise ValueError(f"not JSON: {name}")

    return json.loads(raw, parse_int=Num, parse_float=Num, parse_constant=bad_constant)


def dumps(obj: Any, *, ascii_only: bool = False) -> bytes:
    """Serialize ``obj`` (dicts, lists, str, bool, None, int, float, :class:`Num`); a ``Num``
    is written as its text. Compact separators; UTF-8 unless ``ascii_only``."""
    out: list[str] = []
    _write(obj, out, ascii_only)
    return "".join(out).encode("utf-8")


def _write(obj: Any, out: list[str], ascii_only: bool) -> None:
    # iterative over containers would be faster; recursion is fine up to the nesting we build
    if isinstance(obj, Num | Raw):
        out.append(str(obj))
    elif isinstance(obj, str):
        out.append(json.dumps(obj, ensure_ascii=ascii_only))
    elif obj is None or isinstance(obj, bool):
        out.append(json.dumps(obj))
    elif isinstance(obj, int | float):
        out.append(json.dumps(obj))
    elif isinstance(obj, dict):
        out.append("{")
        for i, (k, v) in enumerate(obj.items()):
            if i:
                out.append(",")
            out.append(json.dumps(str(k), ensure_ascii=ascii_only))
            out.append(":")
            _write(v, out, ascii_only)
        out.append("}")
    elif isinstance(obj, list | tuple):
        out.append("[")
        for i, v in enumerate(obj):
            if i:
                out.append(",")
            _write(v, out, ascii_only)
        out.append("]")
    else:
        raise TypeError(f"cannot serialize {type(obj).__name__}")


def depth(obj: Any) -> int:
    """Nesting depth of containers (a scalar is 0), iteratively (no recursion limit)."""
    best, stack = 0, [(obj, 0)]
    while stack:
        node, d = stack.pop()
        if isinstance(node, dict):
            stack.extend((v, d + 1) for v in node.values())
            best = max(best, d + 1)
        elif isinstance(node, list):
            stack.extend((v, d + 1) for v in node)
            best = max(best, d + 1)
    return best


def number_literals(obj: Any, json_string_keys: frozenset[str] = frozenset()) -> Counter[str]:
    """Every number literal's text in ``obj`` (parsed by :func:`loads`); a string value under a
    key in ``json_string_keys`` is parsed too when it is JSON (tool-call ``arguments``)."""
    found: Counter[str] = Counter()
    stack: list[Any] = [obj]
    while stack:
        node = stack.pop()
        if isinstance(node, Num):
            found[str(node)] += 1
        elif isinstance(node, dict):
            for k, v in node.items():
                if k in json_string_keys and isinstance(v, str) and not isinstance(v, Num):
                    try:
                        stack.append(loads(v))
                    except (ValueError, RecursionError):
                        pass
                else:
                    stack.append(v)
        elif isinstance(node, list):
            stack.extend(node)
    return found
