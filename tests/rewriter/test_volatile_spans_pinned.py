"""The volatile-span scan at its edges (issue 38: tests vary the dimension a rule is about).

The dimensions varied: where a window is cut (a newline at, just inside and just outside the
window's second half; none), how far before a span an example word sits (the 30-character
look-back at its edge), which offset the example test reads (a labelled value's label, not its
value), texts over the memo's limit (scanned in windows, the same spans), and where a span's line
starts and ends around it (the text's first line, a line exactly at the reach).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixgate.rewriter.analysis import volatile_spans as vs
from prefixgate.rewriter.analysis.volatile_spans import LINE_REACH, Span, find_spans, per_request, windows

CLOCK = "2025-03-04T10:15:00Z"


@pytest.fixture(autouse=True)
def _fresh_memo() -> None:
    """Each test scans afresh: a text memoized by an earlier test (or process) would answer
    from the memo, not from the scan under test."""
    vs._find_spans_memo.cache_clear()


# --- windows: cut after the last newline of the window's second half, else at its size --------

@pytest.mark.parametrize("text, size, want", [
    ("", 8, []),
    ("abcdefgh", 8, [(0, 8)]),                             # exactly one window: no cut
    ("abcd\nfgh", 8, [(0, 8)]),                            # one window to the end: never cut
    ("abcdefghi", 8, [(0, 8), (8, 9)]),                    # no newline: cut at the size
    ("abc\nefghi", 8, [(0, 8), (8, 9)]),                   # newline at 3, the first half: no cut point
    ("abcd\nfghi", 8, [(0, 5), (5, 9)]),                   # newline at size // 2: cut right after it
    ("ab\nd\nfg\nij", 8, [(0, 8), (8, 10)]),               # the last newline of the window
    ("abcdefg\nij", 8, [(0, 8), (8, 10)]),                 # a newline as the window's last character
    ("abcdefgh\nj", 8, [(0, 8), (8, 10)]),                 # the newline just past the window: not seen
])
def test_windows_are_cut_after_a_newline_in_their_second_half(text: str, size: int,
                                                              want: list[tuple[int, int]]) -> None:
    assert windows(text, size) == want


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet="ab\n", max_size=60), size=st.integers(2, 12))
def test_windows_tile_the_text_and_cut_where_the_rule_says(text: str, size: int) -> None:
    got = windows(text, size)
    assert [a for a, _ in got] == [0, *[b for _, b in got[:-1]]][:len(got)]   # contiguous from 0
    assert (got[-1][1] if got else 0) == len(text)
    for a, b in got:
        assert 0 < b - a <= size
        if b == len(text) and a + size >= len(text):
            continue                                                # the last window: no cut
        cut = text.rfind("\n", a + size // 2, a + size)
        assert b == (cut + 1 if cut >= 0 else a + size)


# --- example values: the 30 characters before the match ----------------------------------------

@pytest.mark.parametrize("k", [0, 20, 24, 25, 26])
def test_an_example_word_counts_within_thirty_characters_of_the_span(k: int) -> None:
    before = "e.g. " + "x" * k + " "
    assert bool(find_spans(before + CLOCK)) is (len(before) > 30)


def test_an_example_at_the_very_start_of_the_text_counts() -> None:
    assert find_spans("e.g. " + CLOCK) == []
    assert find_spans("for example " + CLOCK) == []
    assert find_spans(CLOCK) == [Span("iso_datetime", 0, len(CLOCK))]


def test_the_example_test_reads_from_the_label_of_a_labelled_value() -> None:
    """``e.g. current time 10:15``: the example word is right before the match (its label), not
    before the value."""
    assert find_spans("e.g. current time 10:15") == []
    assert find_spans("current time 10:15") == [Span("labelled_time", 13, 18)]


# --- long texts: scanned in windows, the same spans ---------------------------------------------

def test_a_text_over_the_memo_limit_finds_the_same_spans_in_every_window() -> None:
    line = f"log line at {CLOCK} with request id abcdef0123456789abcd\n"
    short = line * 10
    long = line * (vs.MEMO_MAX_CHARS // len(line) + 50)
    assert len(long) > vs.MEMO_MAX_CHARS and len(windows(long)) >= 2
    want = find_spans(line)
    assert [s.kind for s in want] == ["iso_datetime", "labelled_id"]
    for text in (short, long):
        got = find_spans(text)
        assert len(got) == 2 * text.count("\n")
        for i, s in enumerate(got):
            base = (i // 2) * len(line)
            w = want[i % 2]
            assert (s.kind, s.start - base, s.end - base) == (w.kind, w.start, w.end)


def test_an_empty_text_and_a_text_without_digits_have_no_spans() -> None:
    assert find_spans("") == []
    assert find_spans("request id abcdefghijklmnopqrstuv, no digit") == []


def test_overlapping_spans_keep_the_earliest_and_longest_and_the_scan_goes_on() -> None:
    text = f"it is {CLOCK} and later {CLOCK}"   # labelled_time would take 10:15:00Z inside the first
    assert find_spans(text) == [Span("iso_datetime", 6, 26), Span("iso_datetime", 37, 57)]


def test_of_two_spans_at_one_start_the_longer_wins() -> None:
    text = "request id 123e4567-e89b-12d3-a456-426614174000-extra1"   # a uuid, a longer id
    assert find_spans(text) == [Span("labelled_id", 11, len(text))]


def test_a_window_without_a_digit_is_skipped_and_the_next_ones_are_scanned() -> None:
    """Every span holds a digit: a window with none is not scanned (a UUID of hex letters only
    is then not flagged), and the scan goes on to the next windows; a digit at a window's very
    first character counts."""
    uuid = "abcdefab-abcd-abcd-abcd-abcdefabcdef"
    assert find_spans("X " + uuid) == []
    assert find_spans("5 " + uuid) == [Span("uuid", 2, 2 + len(uuid))]
    filler = "filler line\n" * 6000                          # a window apart
    assert find_spans("5\n" + filler + uuid + "\n") == []    # a digit only in an earlier window
    assert find_spans(uuid + "\n" + filler + "5\n") == []    # a digit only in a later window
    text = "no digits here\n" * 5000 + "at " + CLOCK + "\n"
    assert len(windows(text)) == 2
    start = text.index(CLOCK)
    assert find_spans(text) == [Span("iso_datetime", start, start + len(CLOCK))]


def test_a_span_never_crosses_a_window_cut() -> None:
    text = " " * (vs.WINDOW_CHARS - 10) + CLOCK + " tail"    # no newline: the cut splits the clock
    assert windows(text)[0] == (0, vs.WINDOW_CHARS)
    assert find_spans(text) == []
    text = " " * (vs.WINDOW_CHARS - 30) + CLOCK + " tail"    # wholly inside the first window
    assert find_spans(text) == [Span("iso_datetime", vs.WINDOW_CHARS - 30, vs.WINDOW_CHARS - 10)]


# --- per_request: the span's own line, wherever the text starts and the line ends ---------------

@pytest.mark.parametrize("prefix, marked", [
    ("request id ", True),                     # the first line of the text, marker at its start
    ("x\nrequest id ", True),                  # the marker right after a newline
    ("request id\n", False),                   # the marker on the line above
])
def test_the_spans_line_starts_right_after_the_newline_before_it(prefix: str, marked: bool) -> None:
    text = prefix + CLOCK + " tail"
    s = text.index(CLOCK)
    assert per_request(text, Span("iso_datetime", s, s + len(CLOCK))) is marked


@pytest.mark.parametrize("gap, marked", [(0, True), (LINE_REACH - len(" nonce"), True),
                                         (LINE_REACH - len(" nonce") + 1, False)])
def test_a_marker_after_the_span_counts_up_to_the_reach(gap: int, marked: bool) -> None:
    text = CLOCK + "-" * gap + " nonce"
    assert per_request(text, Span("iso_datetime", 0, len(CLOCK))) is marked
    assert per_request(text + "\nmore", Span("iso_datetime", 0, len(CLOCK))) is marked


@pytest.mark.parametrize("gap, marked", [(0, True), (LINE_REACH - len("nonce "), True),
                                         (LINE_REACH - len("nonce ") + 1, False)])
def test_a_marker_before_the_span_counts_up_to_the_reach(gap: int, marked: bool) -> None:
    for head in ("", "line above\n"):
        text = head + "nonce " + "-" * gap + CLOCK
        s = text.index(CLOCK)
        assert per_request(text, Span("iso_datetime", s, s + len(CLOCK))) is marked
