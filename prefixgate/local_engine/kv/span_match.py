"""Re-align a prompt with a cached token run across short changed spans (pure, no torch).

When a prompt's radix match stops at position ``j`` (a clock, a per-request id, a counter
changed there), the cached branch below the divergence often continues with the same tokens a
few positions later: ``old = … "10:31" <history>``, ``new = … "10:32" <history> <new turn>``.
``align`` finds that re-alignment: reused runs (token runs equal on both sides) separated by
changed spans, each short on both sides, and the position shift ``d`` of each run (new position
= old position + d; ``d != 0`` when a span tokenized to a different length).

Rule (the gate the engine applies, measured in ``bench/span_reuse.py``): a plan holds at most
``max_spans`` changed spans, each at most ``max_span_tokens`` tokens on BOTH sides, and every
reused run is at least ``min_anchor_tokens`` long. Anything past the last run that fits the
gate is the fresh tail (prefilled normally); when the first span already breaks the gate there
is no plan (a normal prefix match). Source: the safe case of Prompt Cache (Gim et al. 2023) /
CacheBlend (Yao et al. 2024) restricted to short spans (issue 33's measurements).

Content (``changeable``, optional): the tokens that differ inside a window (a token diff of
its two sides; tokens equal on both sides but inside the window are fine) must all be
value-like — digits, hex, separators (``value_like_tokens``). Measured (``bench/span_bounds.py``,
SmolLM2-135M): a changed clock or hex id costs KL ~1e-6..4e-5 nats/token, but 4 tokens of words
replaced by other words, or a whole line inserted, cost 1e-3..5e-3 at the same span size —
size alone is not a safe gate. A window that fails it ends the plan there (the rest is tail).

Greedy and bounded: after each span, the next anchor is the first ``min_anchor_tokens``-gram of
the prompt within ``max_span_tokens`` that also starts within ``max_span_tokens`` on the old
side (closest pair first, then the smallest shift), and a run extends as far as both sides stay
equal. Work: O(len(prompt)) token compares plus O(max_spans * max_span_tokens) gram lookups.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class SpanBounds:
    """The gate: most changed spans, most tokens of one span (each side), shortest reused run."""

    max_spans: int = 4
    max_span_tokens: int = 48
    min_anchor_tokens: int = 16

    def __post_init__(self) -> None:
        if self.max_spans < 1 or self.max_span_tokens < 1 or self.min_anchor_tokens < 1:
            raise ValueError("span bounds must be >= 1")


@dataclass(frozen=True)
class Run:
    """``length`` tokens equal on both sides: ``new[new_start:+length] == old[old_start:+length]``.

    ``shift`` = ``new_start - old_start`` (the RoPE re-rotation the reused keys need).
    """

    new_start: int
    old_start: int
    length: int

    @property
    def shift(self) -> int:
        """Position shift d of this run's tokens (new position = old position + d)."""
        return self.new_start - self.old_start


@dataclass(frozen=True)
class SpanPlan:
    """Reused runs in order; ``spans`` the changed windows between them (and before the first)
    as ``(new_start, new_end, old_start, old_end)``; one side of a window may be empty (an
    insertion or a deletion). No window precedes the first run when both sides start equal."""

    runs: tuple[Run, ...]
    spans: tuple[tuple[int, int, int, int], ...]

    @property
    def reused_tokens(self) -> int:
        """Tokens whose K/V comes from the old run."""
        return sum(r.length for r in self.runs)

    @property
    def end(self) -> int:
        """End (exclusive, in the new sequence's coordinates) of the last reused run."""
        return self.runs[-1].new_start + self.runs[-1].length


def _equal_len(a: list[int], ai: int, b: list[int], bi: int) -> int:
    """Length of the common run of ``a[ai:]`` and ``b[bi:]``."""
    n = min(len(a) - ai, len(b) - bi)
    k = 0
    step = 64
    while k + step <= n and a[ai + k:ai + k + step] == b[bi + k:bi + k + step]:
        k += step
    while k < n and a[ai + k] == b[bi + k]:
        k += 1
    return k


def _next_anchor(new: list[int], i: int, old: list[int], o: int, bounds: SpanBounds
                 ) -> tuple[int, int] | None:
    """The closest ``(a, b)`` with ``a - i, b - o <= max_span_tokens`` where a
    ``min_anchor_tokens``-gram starts on both sides; None when there is none."""
    w, m = bounds.max_span_tokens, bounds.min_anchor_tokens
    grams: dict[tuple[int, ...], list[int]] = {}
    for b in range(o, min(o + w, len(old) - m) + 1):
        grams.setdefault(tuple(old[b:b + m]), []).append(b)
    if not grams:
        return None
    best: tuple[int, int, int, int] | None = None  # (cost, |shift|, a, b)
    for a in range(i, min(i + w, len(new) - m) + 1):
        if best is not None and a - i > best[0]:
            break  # every later a costs more than the best found
        for b in grams.get(tuple(new[a:a + m]), ()):
            key = (max(a - i, b - o), abs((a - i) - (b - o)), a, b)
            if best is None or key < best:
                best = key
    return None if best is None else (best[2], best[3])


VALUE_CHARS = re.compile(r"[\s0-9a-fA-F:.,;+\-_/#\u0120\u010a\u0109\u2581]*")
"""Characters of a value-like token piece: digits, hex letters, separators, whitespace, and the
byte-level BPE / SentencePiece space and newline marks (``Ġ Ċ ĉ ▁``)."""


def value_like_tokens(pieces: Sequence[str | None]) -> frozenset[int]:
    """Token ids whose piece (``tokenizer.convert_ids_to_tokens``) is value-like
    (``VALUE_CHARS``, non-empty): what a clock, a counter or a hex id is made of."""
    return frozenset(i for i, p in enumerate(pieces) if p and VALUE_CHARS.fullmatch(p))


def values_only(a: list[int], b: list[int], changeable: Callable[[int], bool]) -> bool:
    """True when every token that differs between window sides ``a`` and ``b`` (a token diff)
    is ``changeable``."""
    ops = difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
    return all(changeable(t) for tag, i1, i2, j1, j2 in ops if tag != "equal"
               for t in a[i1:i2] + b[j1:j2])


def align(new: list[int], old: list[int], bounds: SpanBounds,
          changeable: Callable[[int], bool] | None = None) -> SpanPlan | None:
    """Plan the reuse of ``old``'s K/V for ``new`` (both start at the divergence point).

    ``new``: the prompt's tokens after the radix match (only the part that may be reused: the
    caller leaves out the last prompt token, which must be computed for logits). ``old``: a
    cached continuation from the same point. ``changeable`` (optional): the content gate (module
    docstring). Returns None when no run fits the gate; otherwise the runs (coordinates
    relative to the divergence point).
    """
    runs: list[Run] = []
    spans: list[tuple[int, int, int, int]] = []
    i = o = 0
    while True:
        found = _next_anchor(new, i, old, o, bounds)
        if found is None:
            break
        a, b = found
        if a > i or b > o:  # a changed window (empty only at the start, mid-page)
            if len(spans) >= bounds.max_spans:
                break
            if changeable is not None and not values_only(new[i:a], old[o:b], changeable):
                break
            spans.append((i, a, o, b))
        length = _equal_len(new, a, old, b)
        runs.append(Run(a, b, length))
        i, o = a + length, b + length
        if i >= len(new) or o >= len(old):
            break
    if not runs:
        return None
    return SpanPlan(tuple(runs), tuple(spans))
