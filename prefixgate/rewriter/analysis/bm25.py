"""Lexical relevance for pruning: a small English term analyser and Okapi BM25 scores.

Used by tool ranking (:mod:`prefixgate.rewriter.analysis.tool_rank`) and passage scoring
(:mod:`prefixgate.rewriter.passes.prune_rag`). Scoring goes through ``bm25s`` (Lù, 2024, "BM25S:
Orders of magnitude faster lexical search via eager sparse scoring"), Lucene variant, ``k1=1.5``,
``b=0.75``. Everything here is pure and deterministic: the same texts give the same scores and the
same order.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

_WORD = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")

STOPWORDS: frozenset[str] = frozenset(
    """a about above after again against all am an and any are as at be because been before being
    below between both but by can could did do does doing down during each few for from further had
    has have having he her here hers herself him himself his how i if in into is it its itself just
    me more most my myself no nor not now of off on once only or other our ours ourselves out over
    own same she should so some such than that the their theirs them themselves then there these
    they this those through to too under until up very was we were what when where which while who
    whom why will with would you your yours yourself yourselves please thanks thank hi hello also
    get set use using given may must shall let lets want need like one would could""".split()  # noqa: SIM905
)


def stem(word: str) -> str:
    """Strip common English inflections (``flights -> flight``, ``booking -> book``).

    A deliberately light suffix stripper (a subset of Porter step 1a/1b): enough to match plural
    and tense variants between a question and a tool or passage, without a stemmer dependency.
    """
    if len(word) <= 3:
        return word
    if word.endswith("ies") and len(word) > 4:
        word = word[:-3] + "y"
    elif word.endswith("sses") or (word.endswith("es") and word[-3] in "sxz" and len(word) > 4):
        word = word[:-2]
    elif word.endswith("s") and not word.endswith(("ss", "us", "is")):
        word = word[:-1]
    if word.endswith("ing") and len(word) > 5:
        word = word[:-3]
    elif word.endswith("ed") and len(word) > 4:
        word = word[:-2]
    return word


def terms(text: str) -> list[str]:
    """Text -> analysed terms: split on case changes, ``_``, ``.``, digits; lowercase; drop
    stopwords; stem. ``"getFlightStatus(flight_id)" -> ["flight", "status", "flight", "id"]``."""
    out: list[str] = []
    for raw in _WORD.findall(text):
        w = raw.lower()
        if w in STOPWORDS or (len(w) == 1 and not w.isdigit()):
            continue
        out.append(stem(w))
    return out


@lru_cache(maxsize=64)
def _index(corpus: tuple[tuple[str, ...], ...]):  # type: ignore[no-untyped-def]
    import bm25s

    retriever = bm25s.BM25(k1=1.5, b=0.75, method="lucene")
    retriever.index([list(doc) if doc else ["\x00empty"] for doc in corpus], show_progress=False)
    return retriever


def bm25_scores(corpus: Sequence[Sequence[str]], query: Sequence[str]) -> list[float]:
    """BM25 score of each document (a list of terms) for ``query`` (a list of terms).

    Returns one float per document, in corpus order; all zeros for an empty query or corpus of
    one empty document. Repeating a query term weights it (bm25s sums per query token). Indexes
    are memoised per corpus, so re-ranking the same catalog on every turn costs one index build.
    """
    if not corpus:
        return []
    q = [t for t in query if t]
    if not q:
        return [0.0] * len(corpus)
    retriever = _index(tuple(tuple(d) for d in corpus))
    vocab = retriever.vocab_dict
    known = [t for t in q if t in vocab]
    if not known:
        return [0.0] * len(corpus)
    scores = retriever.get_scores(known)
    return [round(float(s), 6) for s in scores]
