"""What comes next in a Hermes tool call, from the request's tool schemas and earlier calls.

Pure text logic for ``spec.tool_drafter.ToolSchemaDrafter`` (ToolSpec-style, training-free drafts:
tool-call JSON is mostly fixed by the schema — the frame, the tool name, the argument keys, enum
values — and by earlier calls, whose argument values agents repeat).

A call is written as the Hermes frame the chat layer renders (``server/chat.py``)::

    <tool_call>
    {"name": "<tool>", "arguments": {"<key>": <value>, ...}}
    </tool_call>

``ToolContext.from_prompt`` reads the ``<tools>`` block (one JSON object per line) and every
closed earlier call out of the prompt text; ``next_literal(tail, ctx)`` returns the text the
schema makes likely right after ``tail`` (the end of prompt + output so far), or None. It never
guesses free text (string values not seen before): a wrong draft costs a verification row.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
HEAD = '\n{"name": "'
AFTER_NAME = '", "arguments": {'
END_CALL = "}}\n" + CLOSE
_TOOLS_RE = re.compile(r"<tools>\n(.*?)\n</tools>", re.S)
_CALL_RE = re.compile(re.escape(OPEN) + r"\s*(\{.*?\})\s*" + re.escape(CLOSE), re.S)


@dataclass
class ToolSpec:
    """One tool: ``keys`` (properties in schema order), ``required``, ``enums`` key → values."""

    name: str
    keys: list[str]
    required: list[str]
    enums: dict[str, list[str]] = field(default_factory=dict)


@dataclass
class ToolContext:
    """Tools by name (request order) and ``past[(tool, key)]``: the JSON text of the latest
    value an earlier call gave that argument."""

    tools: dict[str, ToolSpec]
    past: dict[tuple[str, str], str]

    @classmethod
    def from_prompt(cls, text: str) -> ToolContext:
        """Parse the ``<tools>`` block and the closed ``<tool_call>`` blocks of ``text``.

        Lines or calls that are not valid JSON of the expected shape are skipped (a prompt is
        data, never trusted to be well formed).
        """
        tools: dict[str, ToolSpec] = {}
        for block in _TOOLS_RE.findall(text):
            for line in block.splitlines():
                spec = _tool_spec(line)
                if spec is not None:
                    tools.setdefault(spec.name, spec)
        past: dict[tuple[str, str], str] = {}
        for body in _CALL_RE.findall(text):
            try:
                call = json.loads(body)
            except ValueError:
                continue
            args = call.get("arguments") if isinstance(call, dict) else None
            if isinstance(call, dict) and isinstance(call.get("name"), str) and isinstance(args, dict):
                for k, v in args.items():
                    past[(call["name"], str(k))] = json.dumps(v, ensure_ascii=False)
        return cls(tools, past)


def _tool_spec(line: str) -> ToolSpec | None:
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    fn = obj.get("function", obj)
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        return None
    params = fn.get("parameters") if isinstance(fn.get("parameters"), dict) else {}
    props = params.get("properties") if isinstance(params.get("properties"), dict) else {}
    req = [str(k) for k in params.get("required") or [] if isinstance(k, str) and k in props]
    enums = {str(k): [str(e) for e in p["enum"] if isinstance(e, str)] for k, p in props.items()
             if isinstance(p, dict) and isinstance(p.get("enum"), list)}
    return ToolSpec(fn["name"], [str(k) for k in props], req, enums)


def _unique_completion(prefix: str, options: list[str]) -> str | None:
    """The rest of the one option starting with ``prefix`` (the common prefix's rest if
    several), or None when none does or nothing is left to add."""
    hits = [o for o in options if o.startswith(prefix)]
    if not hits:
        return None
    common = hits[0]
    for h in hits[1:]:
        while not h.startswith(common):
            common = common[:-1]
    if len(hits) > 1:
        return common[len(prefix):] or None
    return hits[0][len(prefix):]


@dataclass
class _ArgsScan:
    """State at the end of an arguments object's text (depth 1 = the object itself)."""

    depth: int = 1
    in_string: bool = False
    string_is_key: bool = False
    string_start: int = 0
    key: str | None = None       # the key whose value is being written / was just written
    keys: list[str] = field(default_factory=list)
    expect: str = "key"          # key | colon | value | after_value
    value_start: int = -1


def _scan_args(text: str) -> _ArgsScan:
    """Walk the JSON text after ``"arguments": {`` (no closing brace of the object yet)."""
    st = _ArgsScan()
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if st.in_string:
            if c == "\\":
                i += 2
                continue
            if c == '"':
                st.in_string = False
                if st.depth == 1 and st.string_is_key:
                    st.key = text[st.string_start:i]
                    st.keys.append(st.key)
                    st.expect = "colon"
                elif st.depth == 1:
                    st.expect = "after_value"
        elif c == '"':
            st.in_string, st.string_start = True, i + 1
            st.string_is_key = st.depth == 1 and st.expect == "key"
            if st.depth == 1 and st.expect == "value":
                st.value_start = i
        elif c in "{[":
            if st.depth == 1 and st.expect == "value":
                st.value_start = i
            st.depth += 1
        elif c in "}]":
            st.depth -= 1
            if st.depth == 1:
                st.expect = "after_value"
            if st.depth == 0:
                return st
        elif st.depth == 1:
            if c == ":" and st.expect == "colon":
                st.expect, st.value_start = "value", -1
            elif c == "," and st.expect in ("after_value", "value"):
                st.expect = "key"
            elif not c.isspace() and st.expect == "value":
                st.value_start = i if st.value_start < 0 else st.value_start
        i += 1
    return st


def _next_key_text(spec: ToolSpec, used: list[str]) -> str:
    """``, "<next required key>": `` or the call's end when every required key is written."""
    rest = [k for k in spec.required if k not in used]
    return f', "{rest[0]}": ' if rest else END_CALL


def _value_hint(spec: ToolSpec, key: str, ctx: ToolContext) -> str:
    enum = spec.enums.get(key)
    if enum and len(enum) == 1:
        return json.dumps(enum[0], ensure_ascii=False)
    return ctx.past.get((spec.name, key), "")


def _in_arguments(spec: ToolSpec, args: str, ctx: ToolContext) -> str | None:
    st = _scan_args(args)
    if st.depth == 0:  # the arguments object closed: the call's own brace and the frame
        rest = args[len(args.rstrip()):]
        return None if rest else "}\n" + CLOSE
    if st.depth > 1:
        return None
    unused = [k for k in spec.keys if k not in st.keys]
    if st.in_string and st.string_is_key:
        got = _unique_completion(args[st.string_start:], unused)
        if got is None:
            return None
        key = args[st.string_start:] + got
        return got + '": ' + _value_hint(spec, key, ctx)
    if st.expect == "key":
        first = next((k for k in spec.required if k not in st.keys), None) or (unused[0] if unused else None)
        if first is None:
            return None
        lead = '"' if not args or args.endswith(" ") else ' "'
        return lead + first + '": ' + _value_hint(spec, first, ctx)
    if st.expect == "colon":
        return (" " if args.endswith(":") else ": ") + _value_hint(spec, st.key or "", ctx)
    key = st.key or ""
    if st.expect == "value":
        typed = args[st.value_start:] if st.value_start >= 0 else ""
        if st.in_string:
            opts = [json.dumps(e, ensure_ascii=False) for e in spec.enums.get(key, [])]
            past = ctx.past.get((spec.name, key))
            opts += [past] if past else []
            return _unique_completion(typed, opts) if opts else None
        if not typed:
            hint = _value_hint(spec, key, ctx)
            return hint or None
        past = ctx.past.get((spec.name, key))
        return _unique_completion(typed, [past]) if past else None
    return _next_key_text(spec, st.keys)  # after_value


def next_literal(tail: str, ctx: ToolContext) -> str | None:
    """The text the tool schemas predict right after ``tail`` (prompt + output so far), or None.

    Only the part after the last unclosed ``<tool_call>`` is read, or, when no call is open, a
    partly written opening frame at the very end of ``tail``.
    """
    if not ctx.tools:
        return None
    start = tail.rfind(OPEN)
    if start < 0 or tail.find(CLOSE, start) >= 0:
        for n in range(min(len(OPEN), len(tail)), 1, -1):  # "<tool" ... "<tool_call" at the end
            if OPEN.startswith(tail[-n:]) and tail[-n] == "<":
                return OPEN[n:] + HEAD
        return None
    cur = tail[start + len(OPEN):]
    if len(cur) < len(HEAD):
        return HEAD[len(cur):] if HEAD.startswith(cur) else None
    if not cur.startswith(HEAD):
        return None
    body = cur[len(HEAD):]
    q = body.find('"')
    names = list(ctx.tools)
    if q < 0:
        got = _unique_completion(body, names)
        if got is None:
            return None
        spec = ctx.tools.get(body + got)
        return got + (AFTER_NAME + _first_key(spec, ctx) if spec else "")
    spec = ctx.tools.get(body[:q])
    if spec is None:
        return None
    after = body[q:]
    if len(after) < len(AFTER_NAME):
        return AFTER_NAME[len(after):] + _first_key(spec, ctx) if AFTER_NAME.startswith(after) else None
    if not after.startswith(AFTER_NAME):
        return None
    return _in_arguments(spec, after[len(AFTER_NAME):], ctx)


def _first_key(spec: ToolSpec, ctx: ToolContext) -> str:
    first = spec.required[0] if spec.required else (spec.keys[0] if spec.keys else None)
    if first is None:
        return "}}\n" + CLOSE
    return f'"{first}": ' + _value_hint(spec, first, ctx)


def tool_context_or_none(text: str) -> ToolContext | None:
    """``ToolContext.from_prompt(text)`` when ``text`` declares tools, else None (cheap check)."""
    if "<tools>" not in text:
        return None
    ctx = ToolContext.from_prompt(text)
    return ctx if ctx.tools else None


__all__ = ["ToolContext", "ToolSpec", "next_literal", "tool_context_or_none"]
