"""Flatten a wire body into the ordered list of cacheable blocks a provider hashes.

Prefix caches are byte-exact over the *rendered* prompt, so what matters is the order in which
each provider serializes a request:

* Anthropic Messages: ``tools`` → ``system`` → ``messages`` ("the cache prefix is built in the
  order tools, system, messages"; https://platform.claude.com/docs/en/build-with-claude/prompt-caching).
  Every tool definition, every system block and every content block of every message is one
  block (the unit the 20-block lookback counts). A string ``system`` / ``content`` is the same as
  one text block, so converting ``"system": "..."`` to a one-block list does not change a hash.
* OpenAI Chat: ``tools`` (and a ``response_format`` JSON schema) → ``messages``. OpenAI does not
  document where tools sit in the rendered prompt; the guide only says tools and schemas are part of
  the cacheable prefix and must be identical
  (https://developers.openai.com/api/docs/guides/prompt-caching). Each tool and each whole message
  is one block.

Hashes never include ``cache_control`` markers (moving a breakpoint does not change the bytes the
model reads) but do include key order (a reordered JSON schema is a different prompt, case B04).
``PrefixBlock.text`` holds the canonical text in memory only (for partial matches and volatile-span
diagnosis); it is never written anywhere by this module.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

TokenCounter = Callable[[str], int]
Region = Literal["tools", "system", "messages"]
Api = Literal["openai", "anthropic"]

#: Tokens added per OpenAI chat message for the role/turn markup (OpenAI cookbook
#: "How to count tokens with tiktoken": 3 tokens per message for gpt-4o-class models).
OPENAI_TOKENS_PER_MESSAGE = 3
#: Rough token cost of one image block; images are hashed by content but not tokenized here.
IMAGE_TOKENS_ESTIMATE = 1_000


@dataclass(frozen=True)
class PrefixBlock:
    """One cacheable block of a rendered prompt.

    ``region``: ``"tools" | "system" | "messages"``; ``index``: tool / system block / message
    index inside its region; ``sub``: content-block index inside a message (0 otherwise);
    ``kind``: ``"tool" | "schema" | "text" | "tool_use" | "tool_result" | "image" | "document" |
    "thinking" | "message"`` (OpenAI messages) or the block's own ``type``; ``role``: message role
    or ``None``; ``tokens``: tokens of the block's content (counter passed by the caller);
    ``sha256``: hex digest of the canonical bytes (role and message-start flag included,
    ``cache_control`` excluded); ``cache_ttl``: ``"5m" | "1h"`` when the block carries a
    ``cache_control`` marker, else ``None``; ``text``: canonical text (memory only).
    """

    region: Region
    index: int
    sub: int
    kind: str
    role: str | None
    tokens: int
    sha256: str
    cache_ttl: str | None = None
    text: str = field(default="", repr=False, compare=False)


MEMO_DIGEST_CHARS = 4096
"""Texts from this length are remembered by their length and salted 64-bit hash, not kept."""


def memo_counter(count_tokens: TokenCounter, max_entries: int = 200_000) -> TokenCounter:
    """Wrap ``count_tokens`` with an in-memory memo (agent traces resend the same texts).

    The memo is cleared when it exceeds ``max_entries`` entries, so memory stays bounded: a text
    of :data:`MEMO_DIGEST_CHARS` or more is keyed by ``(len, hash)`` instead of kept (issue 34
    item 17: each session's 1 MB prompt stayed here whole; two texts of one length would have to
    collide in Python's salted 64-bit hash to share a count).
    """
    memo: dict[str | tuple[int, int], int] = {}

    def count(text: str) -> int:
        key: str | tuple[int, int] = text if len(text) < MEMO_DIGEST_CHARS else (len(text), hash(text))
        n = memo.get(key)
        if n is None:
            if len(memo) >= max_entries:
                memo.clear()
            n = memo[key] = count_tokens(text)
        return n

    return count


def _dumps(obj: Any) -> str:
    """Compact JSON, key order kept, non-ASCII unescaped (orjson when it can encode ``obj``)."""
    try:
        return orjson.dumps(obj).decode("utf-8")
    except TypeError:
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _items(value: Any) -> list[Any]:
    """``value`` if it is a JSON array, else ``[]`` (a client's ``"tools": 5`` adds no block)."""
    return value if isinstance(value, list) else []


def _ttl_of(marker: Any) -> str | None:
    if not isinstance(marker, dict):
        return None
    ttl = marker.get("ttl", "5m")
    return "1h" if ttl == "1h" else "5m"


def _without_cache_control(block: Any) -> Any:
    if isinstance(block, dict) and "cache_control" in block:
        return {k: v for k, v in block.items() if k != "cache_control"}
    return block


def _content_text(value: Any) -> str:
    """Plain text of a content value (string, list of parts, or nested tool_result content)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(_content_text(v) for v in value)
    if isinstance(value, dict):
        if isinstance(value.get("text"), str):
            return str(value["text"])
        if "content" in value:
            return _content_text(value["content"])
        if value.get("type") in ("image", "image_url", "input_audio", "document", "file"):
            return ""
        return _dumps(value)
    return str(value)


def _block_tokens(block: dict[str, Any], count: TokenCounter) -> int:
    kind = block.get("type")
    if kind == "text":
        return count(str(block.get("text", "")))
    if kind == "tool_use":
        return count(str(block.get("name", ""))) + count(_dumps(block.get("input", {})))
    if kind == "tool_result":
        inner = block.get("content")
        images = sum(1 for p in inner if isinstance(p, dict) and p.get("type") == "image") \
            if isinstance(inner, list) else 0
        return count(_content_text(inner)) + images * IMAGE_TOKENS_ESTIMATE
    if kind in ("thinking", "redacted_thinking"):
        return count(str(block.get("thinking", block.get("data", ""))))
    if kind in ("image", "document"):
        return IMAGE_TOKENS_ESTIMATE
    return count(_dumps(block))


def _make(region: Region, index: int, sub: int, kind: str, role: str | None, tokens: int,
          canonical: str, ttl: str | None) -> PrefixBlock:
    return PrefixBlock(region=region, index=index, sub=sub, kind=kind, role=role, tokens=tokens,
                       sha256=_sha(canonical), cache_ttl=ttl, text=canonical)


def anthropic_blocks(body: dict[str, Any], count_tokens: TokenCounter) -> list[PrefixBlock]:
    """Blocks of an Anthropic Messages body in cache order: tools → system → messages.

    ``body``: ``{"tools": [...], "system": str | [blocks], "messages": [{"role", "content"}]}``.
    Raises ``TypeError`` when ``messages`` is not a list.
    """
    out: list[PrefixBlock] = []
    for i, tool in enumerate(_items(body.get("tools"))):
        canon = "tool\x00" + _dumps(_without_cache_control(tool))
        tokens = count_tokens(_dumps(_without_cache_control(tool)))
        out.append(_make("tools", i, 0, "tool", None, tokens, canon,
                         _ttl_of(tool.get("cache_control")) if isinstance(tool, dict) else None))
    system = body.get("system")
    if isinstance(system, str) and system:
        system = [{"type": "text", "text": system}]
    for i, blk in enumerate(_items(system)):
        if not isinstance(blk, dict):
            continue
        canon = "system\x00" + _dumps(_without_cache_control(blk))
        out.append(_make("system", i, 0, str(blk.get("type", "text")), "system",
                         _block_tokens(blk, count_tokens), canon, _ttl_of(blk.get("cache_control"))))
    messages = body.get("messages", [])
    if not isinstance(messages, list):
        raise TypeError("messages must be a list")
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            continue
        role = str(msg.get("role", ""))
        content = msg.get("content")
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else _items(content)
        for j, blk in enumerate(parts):
            if not isinstance(blk, dict):
                continue
            canon = f"{role}\x00{int(j == 0)}\x00" + _dumps(_without_cache_control(blk))
            out.append(_make("messages", i, j, str(blk.get("type", "text")), role,
                             _block_tokens(blk, count_tokens), canon,
                             _ttl_of(blk.get("cache_control"))))
    return out


def _openai_message_tokens(msg: dict[str, Any], count: TokenCounter) -> int:
    tokens = OPENAI_TOKENS_PER_MESSAGE + count(_content_text(msg.get("content")))
    content = msg.get("content")
    if isinstance(content, list):
        tokens += IMAGE_TOKENS_ESTIMATE * sum(
            1 for p in content if isinstance(p, dict) and p.get("type") == "image_url")
    for call in _items(msg.get("tool_calls")):
        fn = call.get("function") if isinstance(call, dict) else None
        fn = fn if isinstance(fn, dict) else {}
        tokens += count(str(fn.get("name", ""))) + count(str(fn.get("arguments", "")))
    return tokens


def _openai_marker(msg: dict[str, Any]) -> str | None:
    content = msg.get("content")
    if isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and part.get("cache_control"):
                return _ttl_of(part["cache_control"])
    return _ttl_of(msg.get("cache_control"))


def openai_blocks(body: dict[str, Any], count_tokens: TokenCounter) -> list[PrefixBlock]:
    """Blocks of an OpenAI Chat body: tools, then ``response_format`` schema, then messages.

    System/developer messages are part of ``messages`` (region ``"system"`` for leading ones, so
    break diagnosis can name the system prompt). Raises ``TypeError`` on a non-list ``messages``.
    """
    out: list[PrefixBlock] = []
    for i, tool in enumerate(_items(body.get("tools"))):
        text = _dumps(tool)
        out.append(_make("tools", i, 0, "tool", None, count_tokens(text), "tool\x00" + text, None))
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        text = _dumps(fmt)
        out.append(_make("tools", len(_items(body.get("tools"))), 0, "schema", None,
                         count_tokens(text), "schema\x00" + text, None))
    messages = body.get("messages", [])
    if not isinstance(messages, list):
        raise TypeError("messages must be a list")
    leading_system = True
    sys_index = 0
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            continue
        role = str(msg.get("role", ""))
        leading_system = leading_system and role in ("system", "developer")
        region: Region = "system" if leading_system else "messages"
        index = sys_index if leading_system else i - sys_index
        if leading_system:
            sys_index += 1
        canon = "msg\x00" + _dumps(msg)
        out.append(_make(region, index, 0, "message", role,
                         _openai_message_tokens(msg, count_tokens), canon, _openai_marker(msg)))
    return out


def detect_api(body: dict[str, Any]) -> Api:
    """Guess the wire API of a body: ``"anthropic"`` if it has a top-level ``system``, tools with
    ``input_schema``, or ``tool_use``/``tool_result`` blocks; otherwise ``"openai"``."""
    if "system" in body:
        return "anthropic"
    for tool in _items(body.get("tools")):
        if isinstance(tool, dict) and "input_schema" in tool:
            return "anthropic"
        if isinstance(tool, dict) and tool.get("type") == "function":
            return "openai"
    for msg in _items(body.get("messages")):
        if not isinstance(msg, dict):
            continue
        if msg.get("role") in ("system", "developer", "tool") or "tool_calls" in msg:
            return "openai"
        content = msg.get("content")
        if isinstance(content, list) and any(
                isinstance(b, dict) and b.get("type") in ("tool_use", "tool_result")
                for b in content):
            return "anthropic"
    return "openai"


def flatten(body: dict[str, Any], api: Api, count_tokens: TokenCounter) -> list[PrefixBlock]:
    """Blocks of ``body`` as ``api`` renders them (see :func:`anthropic_blocks`,
    :func:`openai_blocks`). Raises ``ValueError`` on an unknown ``api``."""
    if api == "anthropic":
        return anthropic_blocks(body, count_tokens)
    if api == "openai":
        return openai_blocks(body, count_tokens)
    raise ValueError(f"unknown api {api!r}")


def chain_hashes(blocks: Sequence[PrefixBlock], seed: str = "") -> list[str]:
    """Cumulative prefix hashes: ``out[i]`` = hash of ``seed`` + blocks ``0..i`` (hex sha256).

    Two requests share the prefix through block ``i`` iff their ``out[i]`` are equal.
    """
    out: list[str] = []
    h = _sha("seed\x00" + seed)
    for b in blocks:
        h = _sha(h + b.sha256)
        out.append(h)
    return out


def cumulative_tokens(blocks: Sequence[PrefixBlock]) -> list[int]:
    """``out[i]`` = tokens of blocks ``0..i`` inclusive."""
    out: list[int] = []
    total = 0
    for b in blocks:
        total += b.tokens
        out.append(total)
    return out


def common_prefix_len(a: str, b: str) -> int:
    """Length in characters of the longest common prefix of ``a`` and ``b`` (binary search over
    slice comparisons, so long texts cost O(n log n) in C)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def common_suffix_len(a: str, b: str, limit: int | None = None) -> int:
    """Length of the longest common suffix of ``a`` and ``b``, at most ``limit`` characters."""
    lo, hi = 0, min(len(a), len(b), limit if limit is not None else len(a))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[len(a) - mid:] == b[len(b) - mid:]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def partial_tokens(block: PrefixBlock, other_text: str) -> int:
    """Tokens of ``block`` covered by its common character prefix with ``other_text``.

    Proportional to the shared characters (``floor(tokens * shared / len(text))``): exact token
    boundaries would need the provider's tokenizer over the rendered template, which no client has.
    """
    if not block.text:
        return 0
    shared = common_prefix_len(block.text, other_text)
    return (block.tokens * shared) // len(block.text)
