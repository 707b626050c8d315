"""Whether a span is per-request is read from the span's own line, wherever that line sits
(issue 38 item 8: the check read the wrong line when marker words sat on an earlier line, so a
clock was moved on first sight; the old test put its marker on the first line only).

The dimension varied: where the marker is (the span's line before or after the span, the line
above, the line below, the same line beyond the reach), how long the lines around are (short,
around and over ``LINE_REACH``), and how many lines come before the span's line. The expected
answer is computed here from the rule as documented: a marker on the span's line within
``LINE_REACH`` characters of it.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixgate.rewriter.analysis.volatile_spans import LINE_REACH, Span, find_spans, per_request

CLOCK = "2025-03-04T10:15:00Z"
MARK = "request id"


def _text(where: str, lines_before: int, pad: int) -> tuple[str, Span]:
    """A prompt whose clock line sits after ``lines_before`` lines; ``MARK`` placed ``where``;
    ``pad`` filler characters between the clock and a same-line marker."""
    filler = " ".join(["alpha"] * (pad // 6 + 1))[:pad]
    above = [f"Some context line number {i}." for i in range(lines_before)]
    line = f"Current time: {CLOCK} and more"
    if where == "same_before":
        line = f"{MARK}: {filler} Current time: {CLOCK} and more"
    elif where == "same_after":
        line = f"Current time: {CLOCK} {filler} {MARK}"
    below = ["The user asks a question."]
    if where == "line_above":
        above.append(f"Each {MARK} is logged.")
    elif where == "line_below":
        below.insert(0, f"Each {MARK} is logged.")
    text = "\n".join([*above, line, *below])
    start = text.index(CLOCK)
    return text, Span("iso_datetime", start, start + len(CLOCK))


def _expected(where: str, pad: int) -> bool:
    if where in ("same_before", "same_after"):
        return pad + len(MARK) + 1 < LINE_REACH - 20  # well inside the reach
    return False


@pytest.mark.parametrize("where", ["none", "same_before", "same_after", "line_above", "line_below"])
@pytest.mark.parametrize("lines_before", [0, 1, 5])
@pytest.mark.parametrize("pad", [0, 50, LINE_REACH - 80])
def test_only_a_marker_on_the_spans_own_line_within_reach_counts(where: str, lines_before: int,
                                                                 pad: int) -> None:
    text, span = _text(where, lines_before, pad)
    assert per_request(text, span) is _expected(where, pad)


@pytest.mark.parametrize("where", ["same_before", "same_after"])
def test_a_marker_on_the_same_line_beyond_the_reach_does_not_count(where: str) -> None:
    text, span = _text(where, 3, LINE_REACH + 60)
    assert per_request(text, span) is False


@settings(max_examples=200, deadline=None)
@given(above=st.lists(st.sampled_from(["", "x" * 30, "y" * 450, f"see the {MARK} below", "ok"]),
                      max_size=4),
       below=st.lists(st.sampled_from(["", "z" * 450, f"{MARK} here", "done"]), max_size=3))
def test_lines_around_never_decide_for_the_span(above: list[str], below: list[str]) -> None:
    """Whatever the lines above and below hold (markers, long or empty lines), a clock line with
    no marker is not per-request and one with a marker next to the clock is."""
    for own, want in ((f"Current time: {CLOCK}", False), (f"{MARK} {CLOCK}", True)):
        text = "\n".join([*above, own, *below])
        start = text.index(CLOCK)
        assert per_request(text, Span("iso_datetime", start, start + len(CLOCK))) is want


def test_the_detected_span_is_the_one_checked() -> None:
    text, span = _text("line_above", 2, 0)
    assert any(s.start == span.start for s in find_spans(text))  # the fixture's clock is real
