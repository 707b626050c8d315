"""Token counts kept across requests: an agent's turn N resends turn N-1's texts (issue 25).

:class:`TokenMemo` wraps a :data:`~prefixgate.rewriter.analysis.tokens.TokenCounter` with a memo keyed
by the text itself, so it is exact whatever asks (any pass, any prompt): a count is a pure
function of the text and the encoding. Bounded in characters like session memory is bounded
in bytes: past :attr:`TokenMemo.max_chars` the least recently used texts go. Texts shorter
than :data:`MIN_CHARS` are counted directly (the lookup costs about what counting them does).
Thread-safe (the rewrite runs in worker threads).

A text of :data:`DIGEST_CHARS` or more is not kept: its entry is keyed by its length and
Python's salted 64-bit string hash, and charged :data:`DIGEST_COST` characters (issue 34 item
17: each 1 MB prompt's text was kept whole, a megabyte per session until the bound). Two texts
of one length would have to collide in 64 bits to share a count — about 1e-12 at the entries the
bound allows — and the hash's per-process salt rules out chosen collisions; a count only steers
the passes' budgets, never the bytes sent.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from prefixgate.rewriter.analysis.tokens import TokenCounter

MIN_CHARS = 64
DIGEST_CHARS = 4096
"""Texts from this length are remembered by their digest, not kept (module docstring)."""
DIGEST_COST = 64
"""Characters charged against the bound for an entry kept by digest."""
MAX_CHARS = 32 << 20
"""Default bound: 32 M characters of kept texts (~32-128 MB), about a thousand 28 KB agent
conversations' stable prefixes."""


class TokenMemo:
    """``count(text) -> tokens`` through ``counter``, remembered (module docstring).

    ``hits`` / ``misses``: memo lookups that found / did not find the text; ``chars``: the
    characters kept now (never above ``max_chars``)."""

    def __init__(self, counter: TokenCounter, max_chars: int = MAX_CHARS) -> None:
        if max_chars < 0:
            raise ValueError("max_chars must be >= 0")
        self.counter, self.max_chars = counter, max_chars
        self._memo: OrderedDict[str | tuple[int, int], int] = OrderedDict()
        self._lock = threading.Lock()
        self.chars = self.hits = self.misses = 0

    def __call__(self, text: str) -> int:
        if len(text) < MIN_CHARS:
            return self.counter(text)
        key: str | tuple[int, int] = text if len(text) < DIGEST_CHARS else (len(text), hash(text))
        with self._lock:
            n = self._memo.get(key)
            if n is not None:
                self._memo.move_to_end(key)
                self.hits += 1
                return n
        n = self.counter(text)  # outside the lock: counting is the slow part
        cost = _cost(key)
        with self._lock:
            self.misses += 1
            if key not in self._memo and cost <= self.max_chars:
                self._memo[key] = n
                self.chars += cost
                while self.chars > self.max_chars:
                    old, _ = self._memo.popitem(last=False)
                    self.chars -= _cost(old)
        return n


def _cost(key: str | tuple[int, int]) -> int:
    """Characters an entry is charged: its text's, or :data:`DIGEST_COST` for a digest."""
    return len(key) if isinstance(key, str) else DIGEST_COST
