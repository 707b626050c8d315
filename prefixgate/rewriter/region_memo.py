"""The stable region's rewrite, kept across requests: an agent resends its tools every turn (issue 25).

An agent's turn N is turn N-1 plus a few messages: the tool list (on a 29 KB tau-bench body,
20 KB of it) and the system text come back byte for byte, yet ``canonicalize_tools`` re-derived
each tool's canonical form (a sort, a ``json.dumps`` and a digest per tool: ~5 ms of the ~6 ms
rewrite) and ``stable_prefix_hash`` re-encoded the region (~0.7 ms) on every turn. A
:class:`RegionMemo` keeps both, keyed by a digest of the region's bytes, so a request whose
stable region the proxy has seen costs two C-speed serializations of it; only the conversation
(the new tail, and the passes that read it) is worked on again.

Exact by construction — what a hit returns is what the pass or the hash gives on that input:

- A pass is memoized only when it declares, next to its code, everything it reads besides the
  tool list (:class:`TailFree`: settings fields and session-memory keys). The key is
  ``(pass, blake2b of the tools' JSON in key order, blake2b of those settings' and session
  values' JSON, the token counter object)``; a pass's output is a pure function of that
  (DESIGN.md: passes are pure and deterministic). An entry is stored only when the pass changed
  nothing but ``tools`` (else nothing is stored and the next request runs the pass again).
- Anything not writable exactly by orjson — an :class:`~prefixgate.proxy.core.exactjson`
  number that keeps its text (an ``int`` / ``float`` subclass), an integer beyond 64 bits, a
  non-string key, a dataclass or datetime — makes the key ``None``: no memo, the pass runs as
  it always did. The settings' and session's values must moreover be plain JSON types
  (:func:`plain_json`): orjson writes a tuple as a list, an enum or a UUID as its value, yet a
  pass may tell them apart (``session["tool_order"] != names`` is true for a tuple of the same
  names), so such a value is no key either. The tools are the wire body's JSON (lists, dicts,
  strings, numbers) and are not walked (orjson writes tau-bench's 8.7 KB tool list in ~6 us, a
  Python walk over it takes ~46 us). An Edit's ``memory`` is stored only when plain JSON too
  (a hit hands out ``orjson.loads`` of it).
- A hit's tools are fresh objects (``orjson.loads`` of the stored output), so no request can
  change another's; its Edits are fresh copies (their ``memory`` too). A tool list that differs
  in one byte anywhere — a tool edited in the middle, another key order — is another key: a
  full run of the pass.

Bounded in bytes like session memory: past :attr:`RegionMemo.max_bytes` the least recently
used entries go. Thread-safe (rewrites run in worker threads); the pass itself runs outside
the lock.
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import orjson

from prefixgate.rewriter.types import Context, Edit
from prefixgate.rewriter.wire.ir import Prompt, Tool

MAX_BYTES = 32 << 20
"""Default bound: 32 MB of stored tool lists and Edits (~1,500 distinct 20 KB tool sets)."""
ENTRY_OVERHEAD = 256
"""Bytes charged per entry beyond its stored bytes (key, tuple, dict slot)."""
_EXACT = (orjson.OPT_PASSTHROUGH_SUBCLASS  # an int / str / dict / list subclass: TypeError
          | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME)
_PLAIN = (str, int, float, bool, type(None))


@dataclass(frozen=True)
class TailFree:
    """What a tools-only pass reads besides ``prompt.tools``: ``settings`` (field names of
    ``ctx.settings``) and ``session`` (keys of ``ctx.session``). ``ctx.count_tokens`` is always
    part of the key. A pass that reads anything else must not declare one."""

    settings: tuple[str, ...]
    session: tuple[str, ...]


def exact_bytes(value: Any) -> bytes | None:
    """Compact JSON of ``value`` in key order, or None when orjson cannot write it exactly
    (module docstring: numbers keeping their text, integers past 64 bits, odd keys)."""
    try:
        data = orjson.dumps(value, option=_EXACT)
    except TypeError:
        return None
    if b"null" in data and _has_non_finite(value):  # orjson writes inf / nan as null
        return None
    return data


def plain_json(value: Any) -> bool:
    """True when ``value`` is made of ``dict`` / ``list`` / ``str`` / ``int`` / ``float`` /
    ``bool`` / ``None`` only (exact types: no tuple, enum, UUID or subclass), the values whose
    JSON text tells them all apart (module docstring)."""
    stack = [value]
    while stack:
        v = stack.pop()
        t = type(v)
        if t is dict:
            stack.extend(v.values())
        elif t is list:
            stack.extend(v)
        elif t not in _PLAIN:
            return False
    return True


def _has_non_finite(value: Any) -> bool:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, float) and not math.isfinite(v):
            return True
    return False


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


@dataclass(frozen=True)
class _PassEntry:
    tools: bytes | None  # the output's tool list; None: the pass returned its input
    edits: tuple[tuple[Edit, bytes], ...]  # each Edit and its memory's JSON


PassFn = Callable[[Prompt, Context], tuple[Prompt, list[Edit]]]


class RegionMemo:
    """Memo of the stable region's pass outputs and hash (module docstring).

    ``hits`` / ``misses``: lookups that found / did not find their key (uncacheable inputs
    count as neither); ``bytes``: what is kept now (never above ``max_bytes``)."""

    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[Any, tuple[Any, int]] = OrderedDict()
        self._lock = threading.Lock()
        self.bytes = self.hits = self.misses = 0

    def _get(self, key: Any) -> Any:
        with self._lock:
            got = self._entries.get(key)
            if got is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return got[0]

    def _put(self, key: Any, value: Any, size: int) -> None:
        size += ENTRY_OVERHEAD
        if size > self.max_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.bytes -= old[1]
            self._entries[key] = (value, size)
            self.bytes += size
            while self.bytes > self.max_bytes:
                _, (_, dropped) = self._entries.popitem(last=False)
                self.bytes -= dropped

    def __len__(self) -> int:
        return len(self._entries)

    def run_pass(self, name: str, fn: PassFn, reads: TailFree, prompt: Prompt, ctx: Context
                 ) -> tuple[Prompt, list[Edit]]:
        """``fn(prompt, ctx)``, or what it gave for the same key before (module docstring)."""
        key = self._pass_key(name, reads, prompt, ctx)
        if key is not None:
            entry = self._get(key)
            if entry is not None:
                return _replay(entry, prompt)
        out, edits = fn(prompt, ctx)
        if key is not None:
            stored = _entry(prompt, out, edits)
            if stored is not None:
                entry, size = stored
                self._put(key, entry, size)
        return out, edits

    def stable_hash(self, prompt: Prompt, region: dict[str, Any],
                    compute: Callable[[Prompt], str]) -> str:
        """``compute(prompt)`` (the stable prefix hash), remembered by the digest of ``region``
        (:func:`prefixgate.rewriter.analysis.stable.marked_region`: what the hash is a function of)."""
        data = exact_bytes(region)
        if data is None:
            return compute(prompt)
        key = ("stable_hash", _digest(data))
        got = self._get(key)
        if got is not None:
            return str(got)
        value = compute(prompt)
        self._put(key, value, len(value))
        return value

    @staticmethod
    def _pass_key(name: str, reads: TailFree, prompt: Prompt, ctx: Context) -> Any:
        if prompt.tools is None:
            return None
        read = [[getattr(ctx.settings, s, None) for s in reads.settings],
                [ctx.session.get(k) for k in reads.session]]
        if not plain_json(read):
            return None
        tools = exact_bytes([t.raw for t in prompt.tools])
        values = exact_bytes(read)
        if tools is None or values is None:
            return None
        return (name, _digest(tools), _digest(values), ctx.count_tokens)


def _entry(prompt: Prompt, out: Prompt, edits: list[Edit]) -> tuple[_PassEntry, int] | None:
    """What to store for ``prompt -> out``, and its size; None when ``out`` changed more than
    the tools or does not serialize exactly."""
    kept: list[tuple[Edit, bytes]] = []
    for e in edits:
        mem = exact_bytes(dict(e.memory)) if plain_json(dict(e.memory)) else None
        if mem is None:
            return None
        kept.append((e, mem))
    size = sum(len(m) + len(e.detail) for e, m in kept)
    if out is prompt:
        return _PassEntry(None, tuple(kept)), size
    same_rest = (out.api == prompt.api and out.system is prompt.system
                 and out.messages is prompt.messages and out.params is prompt.params
                 and out.key_order == prompt.key_order
                 and out.system_present == prompt.system_present)
    if not same_rest or out.tools is None:
        return None
    tools = exact_bytes([t.raw for t in out.tools])
    if tools is None:
        return None
    return _PassEntry(tools, tuple(kept)), size + len(tools)


def _replay(entry: _PassEntry, prompt: Prompt) -> tuple[Prompt, list[Edit]]:
    """The stored output on ``prompt``: fresh tool objects and Edits."""
    edits = [replace(e, memory=orjson.loads(mem)) for e, mem in entry.edits]
    if entry.tools is None:
        return prompt, edits
    tools = tuple(Tool(raw) for raw in orjson.loads(entry.tools))
    return replace(prompt, tools=tools), edits
