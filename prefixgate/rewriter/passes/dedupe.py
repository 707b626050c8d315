"""Redundant retrieved passages: the ones whose whole text another passage already carries.

Rule (issue 8, class 3). A passage is redundant when its whitespace-normalised, lowercased text
is contained in (or equal to) another passage's: the same chunk retrieved twice, or a small chunk
inside a larger overlapping one. Dropping it loses no character of information, by construction.
Near-duplicates that merely *look* alike are not redundant: version 2 of a contract differs from
version 1 by the clause the user asks about, and item 2 of a list by its number, so a similarity
threshold (the earlier rule: rapidfuzz ratio >= 92) deleted exactly what mattered. Passages that
are only similar compete for the budget like any other
(:func:`prefixgate.rewriter.passes.prune_rag.select_passages`).
"""

from __future__ import annotations

from collections.abc import Sequence

_SEP = "\x00"


def _norm(text: str) -> str:
    return " ".join(text.replace(_SEP, " ").lower().split())


def near_duplicates(texts: Sequence[str], priority: Sequence[float]) -> set[int]:
    """Indices of ``texts`` to drop because another kept text contains all of their text.

    ``texts``: passage bodies; ``priority``: one score per text (higher is better). Texts are
    visited longest first (ties: higher ``priority``, then lower index); a text is dropped when
    its normalised form occurs inside an earlier-visited one, so of equal texts the best is kept
    and a contained text always has its container kept (containment is transitive). Each test
    is one substring search in the concatenation of the earlier texts. Returns ``set()`` for
    fewer than two texts. Pure, deterministic.
    """
    if len(texts) < 2:
        return set()
    norm = [_norm(t) for t in texts]
    order = sorted(range(len(texts)), key=lambda i: (-len(norm[i]), -priority[i], i))
    joined = _SEP.join(norm[i] for i in order)
    dropped: set[int] = set()
    end = 0
    for i in order:
        if end and norm[i] and joined.find(norm[i], 0, end) >= 0:
            dropped.add(i)
        end += len(norm[i]) + 1
    return dropped
