"""JSON whose numbers keep their exact text: parse -> change -> serialise without silent loss.

orjson reads an integer beyond 64 bits as a float (``123456789012345678901234567890`` ->
``1.2345678901234568e+29``), rejects ``1E400``, and writes floats in their shortest form
(``1.10`` -> ``1.1``, ``1e5`` -> ``100000.0``, ``-0`` -> ``0``). A proxy must send the agent's
numbers as the agent wrote them (issue 8, invariant *Meaning kept*: "Numbers keep their exact
JSON text"), so:

- :func:`loads` keeps orjson's speed on the common path. It parses with orjson, then proves
  that no number changed, cheapest proof first (:func:`_numbers_kept`): the body re-serialises
  to the very bytes it came in (every compact client: one C-speed ``dumps`` + compare), or it
  holds no float at all (big integers come out of orjson as floats) and no ``-0`` token (one
  regex pass; for a body of :data:`CHEAP_PROOF_FIRST_BYTES` or more this proof is tried first,
  so a 30 MB single-string body costs no re-serialisation, issue 34 item 15). Only
  when neither holds does it parse again with the stdlib parser, whose hooks see each number's
  text: a number whose text orjson would change becomes an :class:`ExactInt` /
  :class:`ExactFloat` (a real ``int`` / ``float`` carrying ``.text``), every other number a
  plain ``int`` / ``float``. A body orjson rejects stays rejected, except for a number too large
  for a double (``1E400``), which JSON allows (RFC 8259 section 6 leaves range to
  implementations).
- :func:`dumps` writes :class:`ExactInt` / :class:`ExactFloat` back as their original text
  (``orjson.Fragment``) and integers beyond 64 bits exactly; everything else as orjson does.

Errors: :func:`loads` raises ``ValueError`` (``orjson.JSONDecodeError`` is one) for text that is
not JSON, or that nests deeper than the stdlib parser's recursion allows; :func:`dumps` raises
``TypeError`` for values JSON cannot hold.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

# ``-0`` followed by what may end a number token: an integer minus zero orjson reads as 0.
_MINUS_ZERO = re.compile(rb"-0(?:[,\]} \n\r\t]|\Z)")
CHEAP_PROOF_FIRST_BYTES = 1 << 20
"""From this size the no-float proof comes before the re-serialisation one (see module
docstring): for a few large strings it is one regex pass instead of a copy of the body."""
_I64_MIN, _U64_MAX = -(2 ** 63), 2 ** 64 - 1


class ExactInt(int):
    """An ``int`` read from JSON text orjson cannot write back (beyond 64 bits, or ``-0``).

    ``text``: the token as it appeared in the body (str). Arithmetic gives plain ints."""

    text: str

    def __new__(cls, text: str) -> ExactInt:
        self = super().__new__(cls, int(text))
        self.text = text
        return self

    def __getnewargs__(self) -> tuple[str]:  # type: ignore[override]  # copy / pickle
        return (self.text,)


class ExactFloat(float):
    """A ``float`` read from JSON text that its shortest form would change (``1.10``, ``1e5``,
    ``1E400``, 17+ significant digits). ``text``: the original token. Arithmetic gives floats."""

    text: str

    def __new__(cls, text: str) -> ExactFloat:
        self = super().__new__(cls, float(text))
        self.text = text
        return self

    def __getnewargs__(self) -> tuple[str]:  # type: ignore[override]  # copy / pickle
        return (self.text,)


_UNSET: Any = object()


def _has_float(obj: Any) -> bool:
    """Whether a parsed tree holds a float anywhere. Iterative: linear in the number of nodes."""
    stack = [obj]
    while stack:
        o = stack.pop()
        t = type(o)
        if t is dict:
            stack.extend(o.values())
        elif t is list:
            stack.extend(o)
        elif t is float:
            return True
    return False


def _same_bytes(raw: bytes, tree: Any) -> bool:
    try:
        return orjson.dumps(tree) == raw
    except TypeError:  # nested past orjson's writing depth: the nesting limit refuses it next
        return False


def _numbers_kept(raw: bytes, tree: Any) -> bool:
    """Whether writing ``tree`` (orjson's reading of ``raw``) with orjson keeps every number's
    text. True is a proof; False only means "not proven" (see module docstring)."""
    if len(raw) >= CHEAP_PROOF_FIRST_BYTES:
        return _no_float(raw, tree) or _same_bytes(raw, tree)
    return _same_bytes(raw, tree) or _no_float(raw, tree)


def _no_float(raw: bytes, tree: Any) -> bool:
    return not _has_float(tree) and _MINUS_ZERO.search(raw) is None


def _int(text: str) -> int:
    v = int(text)
    return ExactInt(text) if v > _U64_MAX or v < _I64_MIN or text == "-0" else v


def _float(text: str) -> float:
    v = float(text)
    return v if orjson.dumps(v) == text.encode() else ExactFloat(text)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _is_overflow(e: orjson.JSONDecodeError) -> bool:
    return "number is infinity" in str(e)


def loads(raw: bytes | str) -> Any:
    """Parse JSON text (see module docstring). ``ValueError`` when it is not JSON."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    tree: Any = _UNSET
    try:
        tree = orjson.loads(data)
        if _numbers_kept(data, tree):
            return tree
    except orjson.JSONDecodeError as e:
        if not _is_overflow(e):  # the same acceptance as orjson, but for huge numbers
            raise
    try:
        return json.loads(data.decode("utf-8"), parse_int=_int, parse_float=_float,
                          parse_constant=_no_constant)
    except RecursionError:
        if tree is not _UNSET:  # orjson read it: deeper than any limit, refused by the caller's
            return tree         # nesting check (http.body) in the caller's API shape
        raise ValueError("JSON nested too deeply to keep its numbers exact") from None


def _default(obj: Any) -> Any:
    if isinstance(obj, (ExactInt, ExactFloat)):
        return orjson.Fragment(obj.text)
    kinds: tuple[type[Any], ...] = (bool, int, str, dict, list)
    for kind in kinds:  # other subclasses: as their base type
        if isinstance(obj, kind):
            return kind(obj)
    if isinstance(obj, tuple):
        return list(obj)
    raise TypeError(f"Type is not JSON serializable: {type(obj).__name__}")


def _big_ints_exact(obj: Any) -> Any:
    """``obj`` with every int orjson cannot write (beyond 64 bits) made an ExactInt."""
    if isinstance(obj, dict):
        return {k: _big_ints_exact(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_big_ints_exact(v) for v in obj]
    if type(obj) is int and not _I64_MIN <= obj <= _U64_MAX:
        return ExactInt(str(obj))
    return obj


def dumps(obj: Any) -> bytes:
    """Compact JSON bytes, key order kept, numbers read by :func:`loads` in their original text.
    ``TypeError`` for a value JSON cannot hold."""
    opt = orjson.OPT_PASSTHROUGH_SUBCLASS
    try:
        return orjson.dumps(obj, default=_default, option=opt)
    except orjson.JSONEncodeError as e:
        if "64-bit" not in str(e):
            raise
    return orjson.dumps(_big_ints_exact(obj), default=_default, option=opt)


def pretty(obj: Any) -> str:
    """Indented JSON text (2 spaces, key order kept, numbers as :func:`dumps` writes them), for
    people reading a body (``prefixgate rewrite``)."""
    opt = orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_INDENT_2
    try:
        return orjson.dumps(obj, default=_default, option=opt).decode()
    except orjson.JSONEncodeError:
        return orjson.dumps(_big_ints_exact(obj), default=_default, option=opt).decode()
