"""Does a retrieval's order carry meaning? Then ``stabilise_passages`` leaves it as sent.

Issue 19, item 7: a system prompt said "Retrieved documents (most relevant first; trust the
first one)"; turn 1 sent ``old, new``, turn 2 ``new, old``; putting turn 2 back in turn 1's
order made the model trust the superseded policy. Putting passages in first-seen order is a
cache move only where their order means nothing. It means something when (:func:`order_reason`):

* **the text says so** — the text around the retrieval (the lines above it, the text after it)
  or the prompt's instructions (system text) match :data:`ORDER_WORDS`: ranked, "most relevant
  first", "sorted by", "in order of relevance", "trust the first", "newest first",
  "chronological", "top 5", "best match first", ...;
* **the passages carry ranks** — two or more hold a rank / score / relevance field
  (:data:`RANK_FIELD`: ``rank="1"``, ``score: 0.82``, ``"relevance": 3``);
* **the passages are dated or versioned** — two or more carry a calendar date
  (:data:`DATE`: ``2024-05-15``, ``15 May 2024``, ``May 15, 2024``, ``2024/05/15``) or a version
  (:data:`VERSION`: ``v2.1``, ``version 3``, ``revision 4``), or any one says it supersedes or
  replaces another (:data:`SUPERSEDES`): which comes first may be how the reader tells old
  from new.

The reason is a short phrase for the Edit's detail. Every pattern is bounded (linear scans).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

ORDER_WORDS = re.compile(
    r"(?i)\b(?:most[ -]relevant(?: \w{1,12})? first|(?:in|by) (?:order of |decreasing |descending )?"
    r"relevance|ranked|ranking|rank order|sorted by|ordered by|in (?:descending|ascending|"
    r"decreasing|increasing) order|trust the (?:first|top|earliest|latest)|prefer the (?:first|top|"
    r"earlier|later|latest|earliest)|(?:newest|latest|most recent|oldest|earliest)(?: \w{1,12})? "
    r"first|(?:reverse )?chronological(?:ly)?|top[- ]?\d{1,3}\b|highest[- ]scor\w{0,6}|best "
    r"match(?:es)? first|in priority order|by priority|by date|by recency)")
"""Words that give a list's order a meaning (the text around it, or the instructions)."""
RANK_FIELD = re.compile(
    r"""(?i)(?:\b|["'])(?:rank|score|relevance|similarity|priority)(?:["'])?\s{0,4}[=:]\s{0,4}["']?\d""")
DATE = re.compile(
    r"\b(?:\d{4}[-/]\d{1,2}[-/]\d{1,2}|\d{1,2} (?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
    r"[a-z]{0,6}\.? \d{4}|(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]{0,6}\.? "
    r"\d{1,2}(?:st|nd|rd|th)?,? \d{4})\b")
VERSION = re.compile(r"(?i)\b(?:v\d{1,4}(?:\.\d{1,4}){0,3}|version\s{0,3}\d|rev(?:ision)?\.?\s{0,3}\d)")
SUPERSEDES = re.compile(r"(?i)\b(?:supersed\w{0,4}|replaces|replaced by|obsolete|deprecated|no longer "
                        r"(?:valid|applies|in effect)|outdated)\b")
CONTEXT_CHARS = 400
"""Characters before the first passage and after the last one that count as its text."""


def surroundings(text: str, start: int, end: int) -> str:
    """The text around a retrieval ``text[start:end]``: :data:`CONTEXT_CHARS` either side."""
    return text[max(0, start - CONTEXT_CHARS):start] + "\n" + text[end:end + CONTEXT_CHARS]


def order_reason(around: str, passages: Sequence[str], instructions: str = "") -> str | None:
    """Why the order of ``passages`` (their texts, labels included) carries meaning, or None
    (module docstring). ``around``: the text around the retrieval; ``instructions``: the
    prompt's system text."""
    for where, text in (("the text around it", around), ("the instructions", instructions)):
        m = ORDER_WORDS.search(text)
        if m:
            return f"{where} gives the order a meaning ({m.group(0)!r})"
    if sum(1 for p in passages if RANK_FIELD.search(p)) >= 2:
        return "the passages carry ranks or scores"
    if sum(1 for p in passages if DATE.search(p)) >= 2:
        return "the passages are dated"
    if sum(1 for p in passages if VERSION.search(p)) >= 2:
        return "the passages are versioned"
    m = next((m for p in passages if (m := SUPERSEDES.search(p))), None)
    if m:
        return f"a passage supersedes another ({m.group(0)!r})"
    return None
