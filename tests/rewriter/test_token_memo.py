"""Token counts kept across requests are the counter's own, and the memo stays within its
bound (:class:`prefixgate.rewriter.token_memo.TokenMemo`, issue 25)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixgate.rewriter.analysis.tokens import count_tokens
from prefixgate.rewriter.token_memo import MIN_CHARS, TokenMemo


class Counting:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, text: str) -> int:
        self.calls.append(text)
        return count_tokens(text)


def test_a_resent_text_is_counted_once_and_gets_the_same_count() -> None:
    inner = Counting()
    memo = TokenMemo(inner)
    text = "You are an airline agent. Verify the user id first. " * 20
    assert memo(text) == count_tokens(text) == memo(text)
    assert inner.calls == [text] and (memo.hits, memo.misses) == (1, 1)
    short = "hi there"
    assert len(short) < MIN_CHARS
    memo(short)
    memo(short)
    assert inner.calls.count(short) == 2  # short texts are counted, not kept


@settings(max_examples=40, deadline=None)
@given(texts=st.lists(st.text(min_size=MIN_CHARS, max_size=300), max_size=30),
       bound=st.integers(0, 2_000))
def test_counts_are_exact_and_the_bound_holds(texts: list[str], bound: int) -> None:
    memo = TokenMemo(count_tokens, max_chars=bound)
    for t in texts + texts[::-1]:
        assert memo(t) == count_tokens(t)
        assert memo.chars <= bound
        assert memo.chars == sum(len(k) for k in memo._memo)


def test_the_least_recently_used_text_goes_first() -> None:
    a, b, c = ("a" * 100), ("b" * 100), ("c" * 100)
    inner = Counting()
    memo = TokenMemo(inner, max_chars=200)
    memo(a), memo(b), memo(a), memo(c)  # b is the least recently used when c comes
    inner.calls.clear()
    memo(a), memo(c), memo(b)
    assert inner.calls == [b]


def test_a_negative_bound_is_refused() -> None:
    with pytest.raises(ValueError):
        TokenMemo(count_tokens, max_chars=-1)


def test_a_long_text_is_remembered_by_its_digest_not_kept() -> None:
    """Issue 34 item 17: a 1 MB prompt's text stayed in the memo, a megabyte per session."""
    from prefixgate.rewriter.token_memo import DIGEST_CHARS

    inner = Counting()
    memo = TokenMemo(inner)
    long_text = "Rule: verify the user id first. " * 40_000
    assert len(long_text) >= DIGEST_CHARS
    n = memo(long_text)
    assert memo("".join([long_text])) == n == count_tokens(long_text)  # an equal text: a hit
    assert len(inner.calls) == 1 and memo.hits == 1
    assert not any(isinstance(k, str) and len(k) >= DIGEST_CHARS for k in memo._memo)
    assert memo.chars < 1000  # charged a digest's few characters, not a million
    assert memo(long_text[:-1] + "!") == count_tokens(long_text[:-1] + "!")  # another text
    assert len(inner.calls) == 2
