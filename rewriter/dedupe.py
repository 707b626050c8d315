"""Near-duplicate detection for retrieved passages.

Two passages are near-duplicates when their whitespace-normalised, lowercased texts have a
normalised Indel similarity (``rapidfuzz.fuzz.ratio``) of at least ``threshold`` (0-100; 92 by
default): the same chunk retrieved twice, or the same page crawled with a different header or
footer. Retrievers over overlapping chunks return such pairs often; keeping both spends budget on
no new information.
"""

from __future__ import annotations

from collections.abc import Sequence

DEFAULT_THRESHOLD = 92.0


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def near_duplicates(texts: Sequence[str], priority: Sequence[float],
                    threshold: float = DEFAULT_THRESHOLD) -> set[int]:
    """Indices of ``texts`` to drop as near-duplicates of a kept one.

    Texts are visited best ``priority`` first (ties: lower index first); a text is dropped when it
    is a near-duplicate of an already kept text. Pairs whose lengths differ by more than the
    threshold allows are skipped without comparing (they cannot reach it). O(n^2) comparisons in
    the worst case, each bit-parallel in rapidfuzz. Returns ``set()`` for fewer than two texts.
    """
    from rapidfuzz import fuzz

    if len(texts) < 2:
        return set()
    norm = [_norm(t) for t in texts]
    order = sorted(range(len(texts)), key=lambda i: (-priority[i], i))
    kept: list[int] = []
    dropped: set[int] = set()
    floor = threshold / 100.0
    for i in order:
        for k in kept:
            a, b = len(norm[i]), len(norm[k])
            if min(a, b) * 2 < floor * (a + b):
                continue
            if norm[i] == norm[k] or fuzz.ratio(norm[i], norm[k], score_cutoff=threshold) > 0:
                dropped.add(i)
                break
        else:
            kept.append(i)
    return dropped
