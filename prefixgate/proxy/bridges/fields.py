"""Shared checks for the bridges' request translation: read a field or refuse it, by name.

Issue 8, invariant *Translation is lossless or refuses*: every field a bridge reads maps to its
counterpart, is carried as text with explicit delimiters, or the request is refused with a 400
naming the field. Each bridge lists the keys it knows at every level of the body (its field
tables, also the source of ``docs/bridges.md``); :func:`known_keys` refuses any other key, so a
field the tables do not name can never be dropped silently. Every raise here is
:class:`~prefixgate.proxy.core.errors.InvalidRequest` (400, in the caller's API shape) whose ``param`` is the
field's path in the client's body, e.g. ``messages[2].content[0].source``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, NoReturn

import orjson

from prefixgate.proxy.core.errors import InvalidRequest, quoted

# The JSON type names the two APIs use in their own error messages.
_KINDS = {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
          type(None): "null", int: "an integer", float: "a number"}


def kind_of(v: Any) -> str:
    """``v``'s JSON type name for messages: ``"an object"``, ``"a string"``, ..."""
    for t, name in _KINDS.items():
        if isinstance(v, t) and not (t is int and isinstance(v, bool)):
            return name
    return type(v).__name__


def refuse(param: str, why: str) -> NoReturn:
    """Raise the 400 for a field this bridge cannot carry without loss. ``why``: one sentence."""
    raise InvalidRequest(f"{quoted(param)} cannot be translated for this model's backend (it speaks "
                         f"the other API): {why}", param=param, code="unsupported_parameter")


def bad_type(param: str, want: str, v: Any) -> NoReturn:
    """Raise the 400 for a field of the wrong JSON type."""
    raise InvalidRequest(f"Invalid type for {quoted(param)}: expected {want}, but got {kind_of(v)}.",
                         param=param, code="invalid_value")


def obj(v: Any, param: str) -> dict[str, Any]:
    """``v`` when it is a JSON object, else the 400."""
    if not isinstance(v, dict):
        bad_type(param, "an object", v)
    return v


def arr(v: Any, param: str) -> list[Any]:
    """``v`` when it is a JSON array, else the 400."""
    if not isinstance(v, list):
        bad_type(param, "an array", v)
    return v


def string(v: Any, param: str) -> str:
    """``v`` when it is a string, else the 400."""
    if not isinstance(v, str):
        bad_type(param, "a string", v)
    return v


def boolean(v: Any, param: str) -> bool:
    """``v`` when it is a boolean, else the 400."""
    if not isinstance(v, bool):
        bad_type(param, "a boolean", v)
    return v


def integer(v: Any, param: str) -> int:
    """``v`` when it is an integer (not a boolean), else the 400."""
    if not isinstance(v, int) or isinstance(v, bool):
        bad_type(param, "an integer", v)
    return v


def number(v: Any, param: str) -> float | int:
    """``v`` when it is a number (not a boolean), else the 400."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        bad_type(param, "a number", v)
    return v


def known_keys(o: Mapping[str, Any], known: Collection[str], param: str) -> None:
    """Refuse the first key of ``o`` not in ``known`` (``param``: the path of ``o``)."""
    for k in o:
        if k not in known:
            refuse(f"{param}.{k}" if param else k,
                   "this bridge has no counterpart for this field, and dropping it would change "
                   "the request")


def only_default(body: Mapping[str, Any], key: str, defaults: Collection[Any], param: str = "",
                 ) -> None:
    """Refuse ``body[key]`` unless it is absent or one of ``defaults`` (values that mean the
    same as leaving the field out on both APIs, e.g. ``n: 1``, ``seed: null``)."""
    v = body.get(key)
    if key in body and not any(v == d and isinstance(v, bool) == isinstance(d, bool)
                               for d in defaults):
        refuse(param or key, "the other API has no counterpart; only its default "
               f"({', '.join(_show(d) for d in defaults)}) can be carried")


def _show(v: Any) -> str:
    return orjson.dumps(v).decode()


def open_tag(name: str, attrs: Mapping[str, str | None] | None = None) -> str:
    """``<name a="..." b="...">``: the explicit delimiter for a field carried as text. Attribute
    values are JSON strings (quotes and newlines escaped), absent ones left out."""
    parts = [name] + [f"{k}={_show(v)}" for k, v in (attrs or {}).items() if v is not None]
    return "<" + " ".join(parts) + ">"


def close_tag(name: str) -> str:
    """``</name>``: the closing delimiter matching :func:`open_tag`."""
    return f"</{name}>"
