"""Block texts kept beyond their request, compressed when long (issue 34 item 17).

The cache models' trie (:mod:`prefixgate.cache.provider_models.block_trie`) and the break
detector (:mod:`prefixgate.cache.savings.breaks`) keep each block's canonical text after its
request, to credit a partial match of the first differing block (the common character prefix)
and to name what changed. A 1 MB system prompt was kept as a 1 MB string for every session.

:func:`keep` turns a text of :data:`PACK_CHARS` or more into a :class:`PackedText`: its first
:data:`HEAD_CHARS` characters as they are (two different prompts almost always differ there,
so most comparisons never look further) and the rest zlib-compressed (level 1: ~5 ms per MB,
3-5x smaller on prompt text). :func:`common_prefix_with` compares a text with a kept one,
decompressing only when the whole head matches; :func:`text_of` gives the whole text back.
The packed form of a text is remembered by its digest (the last :data:`MEMO_ENTRIES`), so the
trie and the detector hold one object per text and an unchanged prompt is not compressed again
on its next turn.
"""

from __future__ import annotations

import threading
import zlib
from collections import OrderedDict
from dataclasses import dataclass, replace

from prefixgate.cache.provider_models.prefix_blocks import PrefixBlock, common_prefix_len

PACK_CHARS = 1 << 16
HEAD_CHARS = 4096
MEMO_ENTRIES = 64


@dataclass(frozen=True)
class PackedText:
    """A long text: ``head`` (its first :data:`HEAD_CHARS` characters), ``rest`` (the others,
    UTF-8 with surrogates kept, zlib-compressed), ``length`` (characters in all)."""

    head: str
    rest: bytes
    length: int

    def text(self) -> str:
        """The whole text."""
        return self.head + zlib.decompress(self.rest).decode("utf-8", "surrogatepass")


Kept = str | PackedText
_memo: OrderedDict[str, PackedText] = OrderedDict()
_lock = threading.Lock()


def keep(text: str, digest: str = "") -> Kept:
    """``text`` as it is when short, else its :class:`PackedText` (the one made before for the
    same ``digest`` when there is one)."""
    if len(text) < PACK_CHARS:
        return text
    if digest:
        with _lock:
            got = _memo.get(digest)
            if got is not None and got.length == len(text):
                _memo.move_to_end(digest)
                return got
    packed = PackedText(text[:HEAD_CHARS],
                        zlib.compress(text[HEAD_CHARS:].encode("utf-8", "surrogatepass"), 1),
                        len(text))
    if digest:
        with _lock:
            _memo[digest] = packed
            while len(_memo) > MEMO_ENTRIES:
                _memo.popitem(last=False)
    return packed


def text_of(kept: Kept) -> str:
    """The whole text of ``kept``."""
    return kept if isinstance(kept, str) else kept.text()


def common_prefix_with(text: str, kept: Kept) -> int:
    """Characters ``text`` and the kept text share at their start (the whole text is unpacked
    only when its head matches ``text`` all along)."""
    if isinstance(kept, str):
        return common_prefix_len(text, kept)
    n = common_prefix_len(text, kept.head)
    if n < len(kept.head):
        return n
    return common_prefix_len(text, kept.text())


def partial_tokens_kept(block: PrefixBlock, kept: Kept) -> int:
    """:func:`~prefixgate.cache.provider_models.prefix_blocks.partial_tokens` against a kept
    text."""
    if not block.text:
        return 0
    return (block.tokens * common_prefix_with(block.text, kept)) // len(block.text)


def kept_block(block: PrefixBlock) -> tuple[PrefixBlock, Kept | None]:
    """``(block without its text, the kept text)`` for a long text; ``(block, None)`` else."""
    if len(block.text) < PACK_CHARS:
        return block, None
    return replace(block, text=""), keep(block.text, block.sha256)
