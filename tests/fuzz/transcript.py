"""What a request *means*, in one API-neutral form: the fuzzer's meaning checker reads this.

:func:`transcript` turns a request body of either API (parsed with
:func:`tests.fuzz.jsontext.loads`, numbers as text) into a list of :class:`Msg`, in prompt
order (system first, then messages), each a list of units:

* :class:`Text` — one piece of authored text (a text block, a string content, a document's
  text / title / context, a search result's title and text);
* :class:`Atom` — something that must arrive whole: a tool call ``("call", id, name, args)``
  (args canonicalised with the numbers' exact text, key order ignored), the head of a tool
  result ``("result", id)`` (its content follows as units), media ``("media", sha)`` (image /
  audio / file / base64 document, by the sha of its payload), and blocks the checker does not
  model ``("opaque", type)``.

Both APIs map to the same units, so the client's request and what the upstream received can be
compared whatever bridge ran between them. Nothing here imports the proxy or the rewriter.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from tests.fuzz.jsontext import Num, loads


@dataclass(frozen=True)
class Text:
    """A piece of authored text; ``block``: index of the wire block it came from; ``kind``:
    ``"text"``, ``"result"`` (inside a tool result) or ``"doc"`` (a document / search result:
    retrieved content a pruning pass may remove)."""

    text: str
    block: int = 0
    kind: str = "text"


@dataclass(frozen=True)
class Atom:
    """A unit compared whole (see module docstring)."""

    key: tuple[Any, ...]


@dataclass
class Msg:
    """One message (``role``), or the system prompt (``role="system"``, ``top=True``)."""

    role: str
    units: list[Text | Atom] = field(default_factory=list)
    top: bool = False
    index: int = -1  # position in the wire ``messages`` list (-1: Anthropic top-level system)


def _sha(v: Any) -> str:
    return hashlib.sha256(str(v).encode("utf-8", "surrogatepass")).hexdigest()[:12]


def canon(v: Any) -> Any:
    """A hashable, key-order-free form of a parsed JSON value; numbers by their exact text."""
    if isinstance(v, dict):
        return ("{", tuple(sorted((str(k), canon(x)) for k, x in v.items())))
    if isinstance(v, list):
        return ("[", tuple(canon(x) for x in v))
    if isinstance(v, Num):
        return ("#", str(v))
    return v


def canon_args(args: Any) -> Any:
    """OpenAI tool-call ``arguments`` (a JSON string), canonical; unparseable text stays
    ``("raw", text)``."""
    if isinstance(args, str) and not isinstance(args, Num):
        try:
            return canon_input(loads(args)) if args.strip() else canon({})
        except (ValueError, RecursionError):
            return ("raw", args)
    return canon(args)


def canon_input(value: Any) -> Any:
    """Anthropic ``tool_use.input`` (a JSON value), canonical. Bridges carry unparseable OpenAI
    arguments as ``{"_raw": s}`` and non-object ones as ``{"value": v}``; both read back as
    what they carry."""
    if isinstance(value, dict) and len(value) == 1:
        (k, v), = value.items()
        if k == "_raw" and isinstance(v, str):
            return canon_args(v)
        if k == "value" and not isinstance(v, dict):
            return canon(v)
    return canon(value)


def _media_payload(url: str) -> str:
    return url.split(";base64,", 1)[1] if url.startswith("data:") and ";base64," in url else url


def _anthropic_block(b: Any, i: int, out: list[Text | Atom], kind_: str = "text") -> None:
    n = len(out)
    _anthropic_block_units(b, i, out)
    own = b.get("type") if isinstance(b, dict) else None
    k = kind_ if kind_ != "text" else {"tool_result": "result", "web_search_tool_result": "result",
                                       "document": "doc", "search_result": "doc"}.get(str(own), "text")
    if k != "text":
        out[n:] = [Text(u.text, u.block, k) if isinstance(u, Text) else u for u in out[n:]]


def _anthropic_block_units(b: Any, i: int, out: list[Text | Atom]) -> None:
    if not isinstance(b, dict):
        out.append(Atom(("opaque", type(b).__name__)))
        return
    kind = b.get("type")
    if kind == "text" and isinstance(b.get("text"), str):
        out.append(Text(b["text"], i))
    elif kind == "image":
        src = b.get("source") if isinstance(b.get("source"), dict) else {}
        out.append(Atom(("media", _sha(src.get("data", src.get("url", src))))))
    elif kind == "document":
        src = b.get("source") if isinstance(b.get("source"), dict) else {}
        for key in ("title", "context"):
            if isinstance(b.get(key), str) and b[key]:
                out.append(Text(b[key], i))
        if src.get("type") == "text" and isinstance(src.get("data"), str):
            out.append(Text(src["data"], i))
        elif src.get("type") == "content" and isinstance(src.get("content"), list):
            for sub in src["content"]:
                _anthropic_block(sub, i, out)
        else:
            out.append(Atom(("media", _sha(src.get("data", src.get("url", src))))))
    elif kind == "search_result":
        for key in ("title",):
            if isinstance(b.get(key), str) and b[key]:
                out.append(Text(b[key], i))
        for sub in b.get("content") if isinstance(b.get("content"), list) else []:
            _anthropic_block(sub, i, out)
    elif kind in ("tool_use", "server_tool_use"):
        out.append(Atom(("call", b.get("id"), b.get("name"), canon_input(b.get("input", {})))))
    elif kind in ("tool_result", "web_search_tool_result"):
        out.append(Atom(("result", b.get("tool_use_id"))))
        c = b.get("content")
        if isinstance(c, str):
            if c:
                out.append(Text(c, i))
        elif isinstance(c, list):
            for sub in c:
                _anthropic_block(sub, i, out)
    elif kind in ("thinking", "redacted_thinking"):
        out.append(Atom(("thinking", _sha(b.get("signature", b.get("data"))))))
    else:
        out.append(Atom(("opaque", str(kind))))


def _openai_part(p: Any, i: int, out: list[Text | Atom]) -> None:
    if not isinstance(p, dict):
        out.append(Atom(("opaque", type(p).__name__)))
        return
    kind = p.get("type")
    if kind in ("text", "input_text", "refusal") and isinstance(p.get(kind if kind == "refusal" else "text"), str):
        out.append(Text(p["refusal" if kind == "refusal" else "text"], i))
    elif kind == "image_url":
        iu = p.get("image_url")
        url = iu.get("url", "") if isinstance(iu, dict) else str(iu or "")
        out.append(Atom(("media", _sha(_media_payload(str(url))))))
    elif kind == "input_audio":
        a = p.get("input_audio") if isinstance(p.get("input_audio"), dict) else {}
        out.append(Atom(("media", _sha(a.get("data")))))
    elif kind == "file":
        f = p.get("file") if isinstance(p.get("file"), dict) else {}
        # the file name is text the model reads (OpenAI Chat Completions reference, file part:
        # "used when passing the file to the model as a string"), like a document's title
        if isinstance(f.get("filename"), str) and f["filename"]:
            out.append(Text(f["filename"], i))
        out.append(Atom(("media", _sha(_media_payload(str(f.get("file_data", f.get("file_id"))))))))
    else:
        out.append(Atom(("opaque", str(kind))))


def _openai_content(c: Any, out: list[Text | Atom]) -> None:
    if isinstance(c, str):
        if c:
            out.append(Text(c, 0))
    elif isinstance(c, list):
        for i, p in enumerate(c):
            _openai_part(p, i, out)
    elif c is not None:
        out.append(Atom(("opaque", type(c).__name__)))


def openai_transcript(body: dict[str, Any]) -> list[Msg]:
    """Chat Completions body -> messages of units (see module docstring)."""
    out: list[Msg] = []
    for idx, m in enumerate(body.get("messages") or []):
        if not isinstance(m, dict):
            continue
        role = str(m.get("role"))
        msg = Msg("system" if role == "developer" else role, index=idx)
        if role in ("tool", "function"):
            msg.units.append(Atom(("result", m.get("tool_call_id", m.get("name")))))
        _openai_content(m.get("content"), msg.units)
        if role in ("tool", "function"):
            msg.units = [Text(u.text, u.block, "result") if isinstance(u, Text) else u for u in msg.units]
        calls = m.get("tool_calls")
        for c in calls if isinstance(calls, list) else []:
            fn = c.get("function") if isinstance(c, dict) and isinstance(c.get("function"), dict) else {}
            msg.units.append(Atom(("call", c.get("id") if isinstance(c, dict) else None,
                                   fn.get("name"), canon_args(fn.get("arguments", "")))))
        fc = m.get("function_call")
        if isinstance(fc, dict):
            msg.units.append(Atom(("call", None, fc.get("name"), canon_args(fc.get("arguments", "")))))
        out.append(msg)
    return out


def anthropic_transcript(body: dict[str, Any]) -> list[Msg]:
    """Messages body -> system + messages of units (see module docstring)."""
    out: list[Msg] = []
    system = body.get("system")
    if system is not None:
        top = Msg("system", top=True)
        if isinstance(system, str):
            if system:
                top.units.append(Text(system, 0))
        elif isinstance(system, list):
            for i, b in enumerate(system):
                _anthropic_block(b, i, top.units)
        else:
            top.units.append(Atom(("opaque", type(system).__name__)))
        out.append(top)
    for idx, m in enumerate(body.get("messages") or []):
        if not isinstance(m, dict):
            continue
        msg = Msg(str(m.get("role")), index=idx)
        c = m.get("content")
        if isinstance(c, str):
            if c:
                msg.units.append(Text(c, 0))
        elif isinstance(c, list):
            for i, b in enumerate(c):
                _anthropic_block(b, i, msg.units)
        elif c is not None:
            msg.units.append(Atom(("opaque", type(c).__name__)))
        out.append(msg)
    return out


def transcript(body: dict[str, Any], api: str) -> list[Msg]:
    """The units of ``body`` in ``api`` (``"openai"`` or ``"anthropic"``)."""
    return anthropic_transcript(body) if api == "anthropic" else openai_transcript(body)
