"""Small body builders for cache-model tests. Token counter: one token per whitespace word."""

from __future__ import annotations

from typing import Any


def words(n: int, tag: str = "w") -> str:
    """``n`` distinct-ish words (n tokens under :func:`wc`)."""
    return " ".join(f"{tag}{i}" for i in range(n))


def wc(text: str) -> int:
    """Whitespace word count: a deterministic stand-in tokenizer."""
    return len(text.split())


def cc(ttl: str | None = None) -> dict[str, Any]:
    """A cache_control marker."""
    return {"type": "ephemeral"} if ttl is None else {"type": "ephemeral", "ttl": ttl}


def text(t: str, ttl: str | None = None, mark: bool = False) -> dict[str, Any]:
    """A text block, with a cache_control marker when ``mark`` or ``ttl``."""
    b: dict[str, Any] = {"type": "text", "text": t}
    if mark or ttl:
        b["cache_control"] = cc(ttl)
    return b


def anthropic_body(system: list[dict[str, Any]] | str, messages: list[dict[str, Any]],
                   model: str = "claude-sonnet-4-5", **extra: Any) -> dict[str, Any]:
    """A Messages body."""
    return {"model": model, "max_tokens": 16, "system": system, "messages": messages, **extra}
