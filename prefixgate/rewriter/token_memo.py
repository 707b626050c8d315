"""Token counts kept across requests: an agent's turn N resends turn N-1's texts (issue 25).

:class:`TokenMemo` wraps a :data:`~prefixgate.rewriter.analysis.tokens.TokenCounter` with a memo keyed
by the text itself, so it is exact whatever asks (any pass, any prompt): a count is a pure
function of the text and the encoding. Bounded in characters like session memory is bounded
in bytes: past :attr:`TokenMemo.max_chars` the least recently used texts go. Texts shorter
than :data:`MIN_CHARS` are counted directly (the lookup costs about what counting them does).
Thread-safe (the rewrite runs in worker threads).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from prefixgate.rewriter.analysis.tokens import TokenCounter

MIN_CHARS = 64
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
        self._memo: OrderedDict[str, int] = OrderedDict()
        self._lock = threading.Lock()
        self.chars = self.hits = self.misses = 0

    def __call__(self, text: str) -> int:
        if len(text) < MIN_CHARS:
            return self.counter(text)
        with self._lock:
            n = self._memo.get(text)
            if n is not None:
                self._memo.move_to_end(text)
                self.hits += 1
                return n
        n = self.counter(text)  # outside the lock: counting is the slow part
        with self._lock:
            self.misses += 1
            if text not in self._memo and len(text) <= self.max_chars:
                self._memo[text] = n
                self.chars += len(text)
                while self.chars > self.max_chars:
                    old, _ = self._memo.popitem(last=False)
                    self.chars -= len(old)
        return n
